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
    ["dtypes"],                         # the dtype policy
    ["arraylike"],                      # what a node offers as the array it holds
    ["gradients"],                      # the rules for gradient arrays (unbroadcast, ...)
    ["core"],                           # NetVar, NetOp, back() with its observer slot
    ["modes"],                          # grad / train modes
    ["module"],                         # Module: parameters, buffers, state, devices
    # ops: the operators' and shape families first, then families that build on them
    ["ops.arithmetic", "ops.shape"],
    ["ops.math"],                       # elementwise functions and Where (masks in _grads)
    ["ops.activation", "ops.indexing", "ops.reduce", "ops.loss",
     "ops.regularization", "ops.normalization", "ops.conv", "ops.recurrent"],
    ["ops.embedding", "ops.classification", "ops.cells", "ops.einsum", "ops.attention"],
    ["ops.surface"],                    # NetVar's operators and methods, over every family
    ["ops"],
    ["autodiff"],                       # grad(): gradients as values, gradients of gradients
    ["optim.base"],
    ["optim.gd", "optim.adam", "optim.nesterov", "optim.rmsprop", "optim.adagrad",
     "optim.modifiers", "optim.schedules"],
    ["optim.adamw"],                    # Adam with decoupled weight decay
    ["optim"],
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
                recursive = any(getattr(call.func, "id", getattr(call.func, "attr", None))
                                == child.name for call in calls)
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
# layer is, raises a TypeError naming the layer (hints.refuse_layer_calls, one line in the op).

# The recurrent ops, whose module is moving into a package: each gets the line
#     __new__ = refuse_layer_calls("LSTM")
# in its class (from ..hints import refuse_layer_calls); then remove it from here.
PENDING_LAYER_RULE = {"RNN", "LSTM", "GRU"}


def layer_call(layer):
    """Arguments calling ``layer`` the simplest way: 4 for each required argument (the first
    argument's default when none is required: Dropout(p=0.5))."""
    import inspect
    parameters = [p for p in list(inspect.signature(layer.__init__).parameters.values())[1:]
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [4 for p in parameters if p.default is p.empty]
    return required or [parameters[0].default]


def ops_named_as_layers():
    import nnkit
    return sorted(name for name in nnkit.__all__
                  if isinstance(getattr(nnkit, name), type)
                  and issubclass(getattr(nnkit, name), nnkit.NetOp)
                  and name in nnkit.layers.__all__)


def layer_rule_offenders():
    """Each op named as a layer which, called as its layer is, does not name the layer."""
    import nnkit
    offenders = []
    for name in ops_named_as_layers():
        args = layer_call(getattr(nnkit.layers, name))
        shown = ", ".join(map(repr, args))
        try:
            getattr(nnkit, name)(*args)
        except TypeError as error:
            if f"nn.layers.{name}({shown})" in str(error):
                continue
            offenders.append(f"nn.{name}({shown}) raised {error!r}, not naming "
                             f"nn.layers.{name}({shown}): give the op class the line "
                             f'__new__ = refuse_layer_calls("{name}")')
        except Exception as error:      # noqa: BLE001 (any other error is the offence)
            offenders.append(f"nn.{name}({shown}) raised {error!r}, not a TypeError naming "
                             f"nn.layers.{name}({shown})")
        else:
            offenders.append(f"nn.{name}({shown}) built an op")
    return offenders


def test_an_op_called_as_its_layer_names_the_layer():
    assert len(ops_named_as_layers()) >= 8
    offenders = layer_rule_offenders()
    pending = {line.split("(")[0][3:] for line in offenders} & PENDING_LAYER_RULE
    done = PENDING_LAYER_RULE - pending
    assert not done, f"{sorted(done)} follow the op/layer naming rule now: remove them from " \
                     "PENDING_LAYER_RULE in tests/test_structure.py"
    others = [line for line in offenders if line.split("(")[0][3:] not in PENDING_LAYER_RULE]
    assert others == [], "\n".join(others)


def test_the_layer_rule_checker_names_a_planted_offender(monkeypatch):
    import nnkit

    class ReLU(nnkit.Module):          # a layer named as an op that has no rule
        def __init__(self, features):
            self.features = features

    monkeypatch.setattr(nnkit.layers, "ReLU", ReLU, raising=False)
    monkeypatch.setattr(nnkit.layers, "__all__", [*nnkit.layers.__all__, "ReLU"])
    assert "ReLU" in ops_named_as_layers()
    assert [line[:22] for line in layer_rule_offenders() if "ReLU" in line] == [
        "nn.ReLU(4) raised Attr"]
