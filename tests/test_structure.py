"""The package's import structure: arrows only point down a declared layer order, no circles.

Every module of nnkit is parsed with ``ast`` (imports inside functions count, relative imports
are resolved) and each import of another nnkit module must go to a strictly lower layer.
A new module must be given a layer here; docs/contributing.md explains the layers.
"""
import ast
import fnmatch
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "nnkit"

# Bottom to top. A module may import only modules of a strictly lower layer. Names are relative
# to nnkit ("ops" is the package nnkit/ops/__init__.py, which re-exports every op family);
# a name that matches no file is skipped (modules move in and out during a refactor).
LAYERS = [
    ["checks", "hints"],                # argument checks, PyTorch's spellings; import no nnkit
    ["backend"],                        # NumPy / CuPy, devices, random numbers
    ["dtypes", "modes", "specialize"],  # the dtype policy; grad / train modes; own_code
    ["gradients"],                      # the rules for gradient arrays (unbroadcast, ...)
    ["arraylike", "nodecopy"],          # a node's array side; copies and pickles of nodes
    ["core"],                           # NetVar, NetOp, back() with its observer slot
    ["module"],                         # Module: parameters, buffers, state, devices
    # ops: the operators' and shape families first, then families that build on them
    ["ops.arithmetic", "ops.shape", "ops.recurrent.validation"],
    ["ops.math"],                       # elementwise functions and Where (masks in _grads)
    ["ops.activation", "ops.indexing", "ops.reduce", "ops.loss",
     "ops.regularization", "ops.normalization", "ops.conv"],
    ["ops.embedding", "ops.classification", "ops.einsum", "ops.attention",
     "ops.recurrent.activations"],      # the recurrent family's one activation table
    ["ops.recurrent.fused", "ops.recurrent.cells"],     # fused RNN/LSTM/GRU; per-step cells
    ["ops.recurrent.registry"],         # CELLS, and the loop of cells that unrolls a fused op
    ["ops.recurrent", "ops.cells"],     # the family's package; ops.cells: its old name
    ["ops.surface"],                    # NetVar's operators and methods, over every family
    ["ops"],
    ["autodiff"],                       # grad(): gradients as values, gradients of gradients
    ["optim.flat",                      # small parameters updated together
     "optim.saving"],                   # an optimizer as plain data (state_dict)
    ["optim.base"],
    ["optim.gd", "optim.adam", "optim.nesterov", "optim.rmsprop", "optim.adagrad",
     "optim.modifiers", "optim.schedules"],
    ["optim.adamw"],                    # Adam with decoupled weight decay
    ["optim"],
    # capture and replay of a step: the recording, what the step reads, the replay
    ["replay.instructions",             # what a replay's instructions call
     "replay.inputs"],                  # a step's inputs: refused, kept apart, written back
    ["replay.record", "replay.guards"],     # the recording; how a replay checks what was read
    ["replay.world",                    # what a step reads besides its inputs
     "replay.program"],                 # a recording's instructions as the replay calls them
    ["replay.schedule"],                # one signature's recording: stale?, replay
    ["replay.first_call"],              # how a signature's first call records its schedule
    ["replay.captured"],                # capture(): which recording a call replays
    ["replay"],
    # data parallelism over MPI (mpi4py imported on first use)
    ["distributed.connection", "distributed.packing"],   # the communicator; what is moved
    ["distributed.collectives"],
    ["distributed.parallel"],           # the Trainer's DataParallel hook
    ["distributed"],
    ["init", "data"],
    ["layers.common"],                  # what every layer shares (inputs, sizes, lengths masks)
    ["layers.basic", "layers.recurrent"],   # Modules owning one op's parameters, Sequential
    ["layers.attention"],               # MultiHeadAttention, TransformerEncoderLayer
    ["layers"],
    # io: save/load through the protocol models implement
    ["io.model", "io.fileformat"],      # what can be saved; the file and its description
    ["io.topology"],                    # an FFN's topology as plain data
    ["io.checkpoint"],                  # save and load
    ["io.safetensors", "io.torchfile", "io.torch_state", "io.dlpack"],   # other formats
    ["io.files"],                       # save and load by the file's suffix
    ["io"],
    ["nets.ffn", "nets.sequence"],      # networks: the models built from ops and layers
    ["nets"],
    ["training.metrics"],               # training: the Trainer, its hooks and metrics
    ["training.hooks"],
    ["training.trainer"],
    ["training"],
    # observers and tools over the public API; the engine never imports them
    ["gradient_check", "instrument", "trace"],
    ["viz"],                            # draws graphs and recorded traces
    [""],                               # nnkit/__init__.py: re-exports only
]


def module_names(package):
    """Dotted name relative to the package ("" for its __init__) -> path, for every module."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name, path, modules, top):
    """(line, target) for each import of another module of the package, anywhere in the file."""
    is_package = path.name == "__init__.py"
    here = [part for part in name.split(".") if part]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([top, *base, *([node.module] if node.module else [])])
            else:
                module = node.module
            candidates = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        targets = set()
        for candidate in candidates:
            if candidate != top and not candidate.startswith(top + "."):
                continue
            relative = candidate[len(top) + 1:]
            while relative not in modules:          # `from .core import NetVar` -> core
                relative = relative.rpartition(".")[0]
            targets.add(relative)
        if isinstance(node, ast.ImportFrom) and len(targets) > 1:
            targets.discard(candidates[-1][len(top) + 1:])   # `from . import a` is a, not nnkit
        found.extend((node.lineno, target) for target in sorted(targets) if target != name)
    return found


def import_graph(package):
    modules = module_names(package)
    return modules, {name: imports_of(name, path, modules, package.name)
                     for name, path in modules.items()}


def layer_of(name, layers):
    for level, members in enumerate(layers):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in members):
            return level
    return None


def shown(name, top):
    return f"{top}.{name}" if name else top


def upward_imports(package, layers):
    """Messages naming each import that does not point to a strictly lower layer."""
    modules, graph = import_graph(package)
    top = package.name
    problems = [f"{shown(name, top)} ({modules[name].name}) has no layer: add it to LAYERS in "
                "tests/test_structure.py" for name in modules if layer_of(name, layers) is None]
    for name, edges in graph.items():
        mine = layer_of(name, layers)
        for line, target in edges:
            theirs = layer_of(target, layers)
            if mine is not None and theirs is not None and theirs >= mine:
                where = (f"both are in the layer [{', '.join(layers[mine])}]" if theirs == mine
                         else f"its layer [{', '.join(layers[theirs])}] is above "
                              f"[{', '.join(layers[mine])}]")
                problems.append(f"{shown(name, top)} line {line} imports {shown(target, top)}: "
                                f"{where}; a module may import only from layers below its own")
    return problems


def circles(package):
    """Each import circle as 'a -> b (line n) -> ... -> a', found by depth-first search."""
    _, graph = import_graph(package)
    top = package.name
    found, state, path = [], {}, []

    def visit(name):
        state[name] = "open"
        path.append(name)
        for line, target in graph[name]:
            if state.get(target) == "open":
                loop = path[path.index(target):] + [target]
                lines = {(a, b): n for a in loop for n, b in graph[a]}
                found.append(" -> ".join(
                    shown(a, top) + ("" if b is None else f" (line {lines[(a, b)]})")
                    for a, b in zip(loop, loop[1:] + [None])))
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name)
    return found


def test_no_import_circles():
    assert circles(PACKAGE) == [], "import circles:\n" + "\n".join(circles(PACKAGE))


def test_imports_point_down_the_layers():
    problems = upward_imports(PACKAGE, LAYERS)
    assert problems == [], "imports against the layer order:\n" + "\n".join(problems)


def test_every_layer_name_is_a_module():
    """A misspelt or stale name in LAYERS would go unnoticed: every name must match a module,
    except the modules the current refactor is moving in."""
    modules = module_names(PACKAGE)
    moving = {"dtypes", "modes"}
    stale = [name for layer in LAYERS for name in layer
             if name not in moving and not any(fnmatch.fnmatchcase(m, name) for m in modules)]
    assert stale == []


# ----------------------------------------------------------------------------- the checker itself

def write_package(root, files):
    package = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_checker_names_an_upward_import_inside_a_function(tmp_path):
    package = write_package(tmp_path, {
        "low.py": "import os\n\ndef f():\n    from .high import g\n",
        "high.py": "from . import low\n",
    })
    problems = upward_imports(package, [["low"], ["high"], [""]])
    assert problems == ["pkg.low line 4 imports pkg.high: its layer [high] is above [low]; a "
                        "module may import only from layers below its own"]


def test_checker_resolves_relative_imports_in_subpackages(tmp_path):
    package = write_package(tmp_path, {
        "base.py": "",
        "sub/__init__.py": "from .a import *\n",
        "sub/a.py": "from ..base import thing\nfrom .. import base\nimport pkg.sub.b\n",
        "sub/b.py": "from ..sub import a\n",
    })
    _, graph = import_graph(package)
    assert graph["sub.a"] == [(1, "base"), (2, "base"), (3, "sub.b")]
    assert graph["sub.b"] == [(1, "sub.a")]
    assert graph["sub"] == [(1, "sub.a")]
    assert circles(package) == ["pkg.sub.a (line 3) -> pkg.sub.b (line 1) -> pkg.sub.a"]
    problems = upward_imports(package, [["base"], ["sub.*"], ["sub"], [""]])
    same = "both are in the layer [sub.*]; a module may import only from layers below its own"
    assert problems == [f"pkg.sub.a line 3 imports pkg.sub.b: {same}",
                        f"pkg.sub.b line 1 imports pkg.sub.a: {same}"]


def test_checker_refuses_a_module_without_a_layer(tmp_path):
    package = write_package(tmp_path, {"stray.py": ""})
    assert upward_imports(package, [[""]]) == [
        "pkg.stray (stray.py) has no layer: add it to LAYERS in tests/test_structure.py"]



# ----------------------------------------------------------------------------- one walk

# The one walk over models and collections is nnkit.module.walk. A function elsewhere that
# calls itself and tells containers (list, tuple, dict, Mapping, set) from models or parameters
# (Module, NetVar, FFN) by isinstance is another walker: it would name, dedupe and refuse on
# its own. Those below walk something else, and say what.
WALK = "module.py:walk.visit"
OTHER_WALKS = {
    "io/topology.py:_encode_topology.encode":
        "maps an FFN topology's arguments to JSON data keeping their structure (tuple, list)",
    "nets/ffn.py:FFN.tree": "prints each topology entry's op and arguments; a nested model "
                            "prints itself",
    "training/trainer.py:_describe": "describes what a step function returned, for an error",
    "replay/first_call.py:_outputs": "maps what a captured step returned to the arrays a replay "
                                   "hands out, keeping its structure (tuple, list, dict)",
    "replay/schedule.py:_handed_out": "rebuilds that structure with copies of the arrays",
    "replay/captured.py:_values": "lists the arrays of a step's result, for check=True",
    "replay/world.py:World._visit": "follows the names a step's Python code reads (globals, "
                                    "closures, attributes) to the models and optimizers behind "
                                    "them; the models themselves are walked by walk()",
    "io/torch_state.py:_parts.visit": "pairs each layer with PyTorch's module of the same "
                                      "place, whose names differ from the walk's (a "
                                      "Sequential's entries are PyTorch's 0, 1, ...; a stack of "
                                      "recurrent layers is one PyTorch layer)",
}
CONTAINERS = {"list", "tuple", "dict", "Mapping", "set", "frozenset"}
MODELS = {"Module", "NetVar", "FFN"}


def _isinstance_names(node):
    if isinstance(node, ast.Tuple):
        return {name for item in node.elts for name in _isinstance_names(item)}
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _calls_itself(call, name):
    """Whether ``call`` calls a function named ``name`` as itself: ``name(...)`` or
    ``value.name(...)``, but not a base class's method of that name (``object.__new__``,
    ``NetOp.__init__``, ``super().__init__``)."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == name
    if not isinstance(func, ast.Attribute) or func.attr != name:
        return False
    owner = func.value
    if isinstance(owner, ast.Name) and (owner.id == "object" or owner.id[:1].isupper()):
        return False
    return not (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super")


def recursive_walkers(package):
    """``path:qualified.name`` of every function of ``package`` that calls itself (as a
    function or as a method of another object) and checks values against containers and
    models (or reads ``vars()`` / ``members()``) with isinstance."""
    found = []

    def visit(node, prefix, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                calls = [n for n in ast.walk(child) if isinstance(n, ast.Call)]
                recursive = any(_calls_itself(call, child.name) for call in calls)
                checked = set().union(*(_isinstance_names(call.args[1]) for call in calls
                                        if getattr(call.func, "id", None) == "isinstance"
                                        and len(call.args) == 2))
                reads = any(getattr(call.func, "id", None) == "vars"
                            or getattr(call.func, "attr", None) == "members" for call in calls)
                if recursive and checked & CONTAINERS and (checked & MODELS or reads):
                    found.append(f"{path}:{name}")
                visit(child, name + ".", path)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", path)
            else:
                visit(child, prefix, path)

    for file in sorted(package.rglob("*.py")):
        visit(ast.parse(file.read_text(encoding="utf-8"), str(file)), "",
              file.relative_to(package).as_posix())
    return found


def walks_beside_the_walk(package):
    return [f"{name} walks models or collections on its own: use nnkit.module.walk (or, if it "
            "walks something else, add it to OTHER_WALKS in tests/test_structure.py, saying what)"
            for name in recursive_walkers(package) if name != WALK and name not in OTHER_WALKS]


def test_one_walk_over_models_and_collections():
    assert WALK in recursive_walkers(PACKAGE)
    problems = walks_beside_the_walk(PACKAGE)
    assert problems == [], "\n".join(problems)


def test_checker_names_a_planted_walker(tmp_path):
    package = write_package(tmp_path, {"models.py": (
        "from .module import Module\n\n"
        "class Net(Module):\n"
        "    def params(self, value=None):\n"
        "        out = []\n"
        "        for item in (value if value is not None else vars(self).values()):\n"
        "            if isinstance(item, (list, dict)):\n"
        "                out += self.params(item)\n"
        "            elif isinstance(item, Module):\n"
        "                out += item.params()\n"
        "        return out\n"),
        "helpers.py": "def flat(x):\n    return [y for i in x for y in flat(i)] "
                      "if isinstance(x, list) else [x]\n"})
    assert walks_beside_the_walk(package) == [
        "models.py:Net.params walks models or collections on its own: use nnkit.module.walk "
        "(or, if it walks something else, add it to OTHER_WALKS in tests/test_structure.py, "
        "saying what)"]
# ----------------------------------------------------------------------------- the public surface
# `import nnkit` shows the names of nnkit.__all__ and nothing else public: no module leaked by an
# import, no name hiding a module of the package, each alias (two names, one object) deliberate
# and listed once in docs/pytorch.md's "Aliases" section.

ALIASES_PAGE = PACKAGE.parent / "docs" / "pytorch.md"


def surface_problems(module, package_dir):
    """Messages naming each offender of ``module``'s public surface (``package_dir`` its
    folder, where its submodules are files)."""
    import types
    public = set(getattr(module, "__all__", ()))
    names = {name: value for name, value in vars(module).items() if not name.startswith("_")}
    problems = [f"{module.__name__}.__all__ is missing" for _ in [0] if not public]
    problems += [f"{module.__name__}.{name} is in __all__ but not defined"
                 for name in sorted(public - set(names))]
    problems += [f"{module.__name__}.{name} is public but not in __all__"
                 for name in sorted(set(names) - public) if name != "dtype"]
    problems += [f"{module.__name__}.{name}: the module {value.__name__} leaked by an import "
                 "(delete it from the namespace, or make it public in __all__)"
                 for name, value in sorted(names.items())
                 if isinstance(value, types.ModuleType) and name not in public]
    for name, value in sorted(names.items()):
        on_disk = (package_dir / f"{name}.py").is_file() or (package_dir / name).is_dir()
        if on_disk and getattr(value, "__name__", None) != f"{module.__name__}.{name}":
            problems.append(f"{module.__name__}.{name} ({type(value).__name__}) hides the module "
                            f"{module.__name__}.{name}: rename one of them")
    return problems


def alias_groups(module):
    """Each group of names of ``__all__`` bound to one object, as a sorted tuple."""
    groups = {}
    for name in module.__all__:
        if name in vars(module):
            groups.setdefault(id(vars(module)[name]), []).append(name)
    return sorted(tuple(sorted(names)) for names in groups.values() if len(names) > 1)


def undocumented_aliases(module, page_text):
    """Each alias group that is not one row of the page's "Aliases" section (a row names
    every name of its group in backquotes), or is listed more than once."""
    section = page_text.split("\n## Aliases", 1)[-1].split("\n## ", 1)[0] \
        if "\n## Aliases" in page_text else ""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    problems = []
    for group in alias_groups(module):
        found = [row for row in rows if all(f"`{name}`" in row for name in group)]
        if len(found) != 1:
            problems.append(f"the alias {' = '.join(group)} is listed {len(found)} times in the "
                            "Aliases section of docs/pytorch.md (once, saying why)")
    return problems


def test_the_public_surface_is_all_and_only_all():
    import nnkit
    problems = surface_problems(nnkit, PACKAGE)
    assert problems == [], "\n".join(problems)


def test_every_alias_is_listed_once_in_the_docs():
    import nnkit
    problems = undocumented_aliases(nnkit, ALIASES_PAGE.read_text(encoding="utf-8"))
    assert problems == [], "\n".join(problems)


def test_surface_checker_names_each_planted_offender(tmp_path):
    import types
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "sub").mkdir()
    fake = types.ModuleType("pkg")
    fake.__all__ = ["f", "g", "gone", "helpers"]
    fake.f = fake.g = len                         # an alias
    fake.sub = types.ModuleType("pkg.sub")        # a module leaked by an import
    fake.helpers = print                          # a function hiding the module pkg.helpers
    fake.extra = 1                                # public, not in __all__
    assert surface_problems(fake, tmp_path) == [
        "pkg.gone is in __all__ but not defined",
        "pkg.extra is public but not in __all__",
        "pkg.sub is public but not in __all__",
        "pkg.sub: the module pkg.sub leaked by an import (delete it from the namespace, or make "
        "it public in __all__)",
        "pkg.helpers (builtin_function_or_method) hides the module pkg.helpers: rename one of "
        "them",
    ]
    fake.__all__.remove("gone")
    missing = "the alias f = g is listed 0 times in the Aliases section of docs/pytorch.md"
    assert undocumented_aliases(fake, "\n## Aliases\n| `f` |\n")[0].startswith(missing)
    twice = "\n## Aliases\n| `f`, `g` | one |\n| `g` = `f` | two |\n"
    assert "listed 2 times" in undocumented_aliases(fake, twice)[0]
    assert undocumented_aliases(fake, "\n## Aliases\n| `f` | `g` | why |\n## Next\n") == []


def test_old_module_spelling_warns_naming_the_new_one():
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from nnkit.gradcheck import GradcheckReport
    import nnkit.gradient_check
    assert GradcheckReport is nnkit.gradient_check.GradcheckReport
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "nnkit.gradient_check" in str(caught[0].message)


def test_submodules_stay_importable():
    import nnkit
    import nnkit.ops
    import nnkit.optim.adam
    assert nnkit.ops.Sum is nnkit.Sum and nnkit.optim.adam.Adam is nnkit.Adam
    assert "ops" not in vars(nnkit) and "ops" not in dir(nnkit)


# ----------------------------------------------------------------------------- ops named as layers
# An op that shares its name with a layer (nn.Conv2D and nn.layers.Conv2D), called the way its
# layer is (its sizes as positional numbers, its options by keyword, or nothing), raises a
# TypeError naming the layer (hints.AppliedOp, in the op's class header).


def layer_calls(layer):
    """The ways of calling ``layer`` that the op of its name must refuse, as (args, keywords):
    4 for each required argument (the first argument's default when none is required:
    Dropout(0.5)); its first argument by keyword (Dropout(p=0.5)); nothing at all."""
    import inspect
    parameters = [p for p in list(inspect.signature(layer.__init__).parameters.values())[1:]
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [4 for p in parameters if p.default is p.empty]
    first = parameters[0]
    return [(required or [first.default], {}),
            ((), {first.name: 4 if first.default is first.empty else first.default}),
            ((), {})]


def ops_named_as_layers():
    import nnkit
    return sorted(name for name in nnkit.__all__
                  if isinstance(getattr(nnkit, name), type)
                  and issubclass(getattr(nnkit, name), nnkit.NetOp)
                  and name in nnkit.layers.__all__)


def layer_rule_offenders():
    """Each call of an op named as a layer which, made as its layer's is, does not name the
    layer."""
    import nnkit
    offenders = []
    for name in ops_named_as_layers():
        for args, keywords in layer_calls(getattr(nnkit.layers, name)):
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in keywords.items())])
            expected = f"nn.layers.{name}({shown or '...'})"
            try:
                getattr(nnkit, name)(*args, **keywords)
            except TypeError as error:
                if expected in str(error):
                    continue
                offenders.append(f"nn.{name}({shown}) raised {error!r}, not naming {expected}: "
                                 "give the op class metaclass=AppliedOp and "
                                 'module_call = "layer" (nnkit.hints)')
            except Exception as error:      # noqa: BLE001 (any other error is the offence)
                offenders.append(f"nn.{name}({shown}) raised {error!r}, not a TypeError naming "
                                 f"{expected}")
            else:
                offenders.append(f"nn.{name}({shown}) built an op")
    return offenders


def test_an_op_called_as_its_layer_names_the_layer():
    assert len(ops_named_as_layers()) >= 8
    offenders = layer_rule_offenders()
    assert offenders == [], "\n".join(offenders)


def test_the_layer_rule_checker_names_a_planted_offender(monkeypatch):
    import nnkit

    class ReLU(nnkit.Module):          # a layer named as an op that has no rule
        def __init__(self, features):
            self.features = features

    monkeypatch.setattr(nnkit.layers, "ReLU", ReLU, raising=False)
    monkeypatch.setattr(nnkit.layers, "__all__", [*nnkit.layers.__all__, "ReLU"])
    assert "ReLU" in ops_named_as_layers()
    assert [line.split(" raised ")[0] for line in layer_rule_offenders() if "ReLU" in line] == [
        "nn.ReLU(4)", "nn.ReLU(features=4)", "nn.ReLU()"]


# ----------------------------------------------------------------------------- private names

# The op contract's fast slots, read by every op file on every call (core.NetOp's docstring says
# why: no property call, no copy of a shared gradient), the one helper that names a node in
# errors, and the contract's second-order rules, which grad(create_graph=True) (autodiff) calls
# as the engine calls _back. No other private name is read outside the unit that defines it.
ALLOWED_PRIVATE = {"_data", "_g", "_parents", "_describe", "_grads", "_composite"}


def unit_of(path, package):
    """The unit a file belongs to: its top-level package (ops, optim, ...), or the top-level
    module itself (core, gradients, ...)."""
    parts = path.relative_to(package).with_suffix("").parts
    return parts[0]


def _private(name):
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _definitions(tree):
    """The private names a file defines: functions, classes, module names, slots, and
    attributes it assigns (``obj._x = ...``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            found.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            found.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif isinstance(node, ast.alias) and node.asname:
            found.add(node.asname)
    return {name for name in found if _private(name)}


def _module_of_import(node, name, package, modules):
    """The module (dotted, relative to the package) an ``ImportFrom`` reads from."""
    here = [part for part in name.split(".") if part]
    is_package = modules[name].name == "__init__.py"
    if node.level:
        base = here if is_package else here[:-1]
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join([*base, *([node.module] if node.module else [])])
    top = package.name
    if node.module == top or (node.module or "").startswith(top + "."):
        return node.module[len(top) + 1:]
    return None


def private_reads(package, allowed=ALLOWED_PRIVATE):
    """``(path, line, name, owner)`` for each read of a private name that only another unit
    defines: ``from x import _name``, ``module._name`` and ``obj._name``."""
    modules = module_names(package)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path))
             for name, path in modules.items()}
    units = {name: unit_of(path, package) for name, path in modules.items()}
    defined = {}                                   # private name -> units defining it
    for name, tree in trees.items():
        for private in _definitions(tree):
            defined.setdefault(private, set()).add(units[name])
    found = []
    for name, tree in trees.items():
        unit, path = units[name], modules[name]
        imported = {}                              # local name -> the unit of the module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _module_of_import(node, name, package, modules)
                if source is None:
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}" if source else alias.name
                    if target in modules:          # `from .. import core`: a module
                        imported[alias.asname or alias.name] = units[target]
                    elif _private(alias.name) and source in modules and \
                            units[source] != unit:
                        found.append((path, node.lineno, alias.name, units[source]))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant):       # getattr(x, "_name")
                attribute, value = node.args[1].value, node.args[0]
            elif isinstance(node, ast.Attribute):
                attribute, value = node.attr, node.value
            else:
                continue
            if not isinstance(attribute, str) or not _private(attribute) or attribute in allowed:
                continue
            owner = value.id if isinstance(value, ast.Name) else None
            if owner in imported:                  # `core._name`, read or written
                if imported[owner] != unit:
                    found.append((path, node.lineno, attribute, imported[owner]))
            elif isinstance(getattr(node, "ctx", ast.Load()), ast.Load) and \
                    unit not in defined.get(attribute, {unit}):
                found.append((path, node.lineno, attribute,
                              ", ".join(sorted(defined[attribute]))))
    return sorted(found, key=lambda read: (str(read[0]), read[1], read[2]))


def _shown(package, reads):
    return [f"{path.relative_to(package.parent)}:{line} uses {name}, private to "
            f"{owner}" for path, line, name, owner in reads]


def test_no_package_reads_another_packages_private_names():
    reads = private_reads(PACKAGE)
    assert reads == [], ("private names read outside the package that defines them (give the "
                         "name a public spelling there, docs/contributing.md 'The engine's "
                         "interface'):\n" + "\n".join(_shown(PACKAGE, reads)))




def test_private_name_checker_names_the_file_line_and_name(tmp_path):
    package = write_package(tmp_path, {
        "core.py": "class Node:\n    __slots__ = ('_data', '_secret')\n\n"
                   "def _helper():\n    pass\n",
        "ops/__init__.py": "",
        "ops/a.py": "from .. import core\nfrom ..core import _helper\n\n"
                    "def f(x):\n    return x._secret + x._data + core._helper()\n",
        "ops/b.py": "def g(x):\n    x._mine = 1\n    return x._mine\n",
        "tool.py": "from . import core\n\ncore._hook = print\n"
                   "flag = getattr(object(), '_secret', None)\n",
    })
    assert _shown(package, private_reads(package, allowed={"_data"})) == [
        "pkg/ops/a.py:2 uses _helper, private to core",
        "pkg/ops/a.py:5 uses _helper, private to core",
        "pkg/ops/a.py:5 uses _secret, private to core",
        "pkg/tool.py:3 uses _hook, private to core",
        "pkg/tool.py:4 uses _secret, private to core",
    ]


def test_core_holds_the_engine_in_at_most_400_lines():
    lines = len((PACKAGE / "core.py").read_text(encoding="utf-8").splitlines())
    assert lines <= 400, (f"nnkit/core.py has {lines} lines, more than 400: keep NetVar, NetOp "
                          "and the backward pass there, move the rest to the module it serves")


# ----------------------------------------------------------------------------- one of each

# Each table of the recurrent family is written once, where its kind is defined.
ONE_TABLE = {
    "cell-name table": ("nnkit/ops/recurrent/registry.py", {"rnn", "lstm", "gru"}),
    "activation table": ("nnkit/ops/recurrent/activations.py", {"tanh", "sigmoid", "relu"}),
}
STABLE_SIGMOID = "nnkit/ops/activation.py"      # the one place that computes σ


def second_tables(package):
    """``(path, line, kind)`` for each dict literal keyed by the recurrent cell names or the
    activation names outside its one place, and each function computing a sigmoid (a def named
    *sigmoid* that calls exp) outside ``STABLE_SIGMOID``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        shown_path = str(path.relative_to(package.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if any(isinstance(k, str) and k.startswith("__") for k in keys):
                    continue                  # a table of dunder methods, not of names
                for kind, (home, names) in ONE_TABLE.items():
                    if names <= keys and shown_path != home:
                        found.append((shown_path, node.lineno, kind))
            elif isinstance(node, ast.FunctionDef) and "sigmoid" in node.name.lower() and \
                    shown_path != STABLE_SIGMOID and any(
                        (isinstance(call.func, ast.Attribute) and call.func.attr == "exp") or
                        (isinstance(call.func, ast.Name) and call.func.id == "exp")
                        for call in ast.walk(node) if isinstance(call, ast.Call)):
                found.append((shown_path, node.lineno, "sigmoid"))
    return found


def test_the_recurrent_tables_and_the_stable_sigmoid_are_written_once():
    extra = [f"{path}:{line} writes a {kind} of its own (the one is in "
             f"{ONE_TABLE[kind][0] if kind in ONE_TABLE else STABLE_SIGMOID}: import it)"
             for path, line, kind in second_tables(PACKAGE)]
    assert extra == [], "\n".join(extra)


def test_the_one_table_checker_names_a_second_table(tmp_path):
    package = write_package(tmp_path, {
        "a.py": "CELLS = {'rnn': 1, 'lstm': 2, 'gru': 3}\n"
                "SURFACE = {'__add__': 1, 'tanh': 2, 'sigmoid': 3, 'relu': 4}\n",
        "b.py": "import numpy\n\ndef my_sigmoid(x):\n    return 1 / (1 + numpy.exp(-x))\n",
    })
    assert second_tables(package) == [("pkg/a.py", 1, "cell-name table"),
                                      ("pkg/b.py", 3, "sigmoid")]


# ----------------------------------------------------------------------------- one graph walk

GRAPH_WALK = "nnkit/core.py"        # core.collect: back(), grad() and the trace use it


def graph_walks(package):
    """``(path, line)`` of each loop over a node's parents that queues the parent it reaches
    (``for p in node.parents: ... stack.append(p)``): a walk over the graph of its own."""
    found = []
    for path in sorted(package.rglob("*.py")):
        shown_path = str(path.relative_to(package.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "extend" and \
                    any(isinstance(a, ast.Attribute) and a.attr in ("parents", "_parents")
                        for a in node.args) and shown_path != GRAPH_WALK:
                found.append((shown_path, node.lineno))     # stack.extend(node.parents)
                continue
            if not (isinstance(node, ast.For) and isinstance(node.target, ast.Name) and
                    isinstance(node.iter, ast.Attribute) and
                    node.iter.attr in ("parents", "_parents")):
                continue
            queued = any(isinstance(call, ast.Call) and isinstance(call.func, (ast.Attribute,
                                                                              ast.Name))
                         and any(isinstance(a, ast.Name) and a.id == node.target.id
                                 for a in call.args)
                         and (getattr(call.func, "attr", None) or call.func.id) in (
                             "append", "add", "visit", "extend", "put", "appendleft")
                         for statement in node.body for call in ast.walk(statement))
            if queued and shown_path != GRAPH_WALK:
                found.append((shown_path, node.lineno))
    return found


def test_one_graph_walk():
    walks = [f"{path}:{line} walks the graph itself: use core.collect (docs/contributing.md, "
             "'The engine's interface')" for path, line in graph_walks(PACKAGE)]
    assert walks == [], "\n".join(walks)


def test_the_graph_walk_checker_names_a_walk_of_its_own(tmp_path):
    package = write_package(tmp_path, {
        "tool.py": "def reach(root):\n    seen, stack = set(), [root]\n    while stack:\n"
                   "        for p in stack.pop().parents:\n            seen.add(p)\n"
                   "            stack.append(p)\n    return seen\n",
        "draw.py": "def edges(node):\n    return [(p, node) for p in node.parents]\n",
        "copies.py": "def below(node):\n    found, stack = set(), list(node._parents)\n"
                     "    while stack:\n        parent = stack.pop()\n"
                     "        found.add(parent)\n        stack.extend(parent._parents)\n"
                     "    return found\n",
    })
    assert graph_walks(package) == [("pkg/copies.py", 6), ("pkg/tool.py", 4)]
