"""What a captured step reads besides its inputs, found before it records, and the guards
(``guards.py``) that check at every replay that none of it changed.

A replay does not run the step's Python, so whatever that Python read is checked instead. It
is found twice: before the step records, from the names its code reads (below), and while it
records, from every Python function that runs (``meet``, called by a profile hook: a helper's
arguments, a ``__call__``'s object, code reached in ways no name shows).

- the names the step's code reads: its globals, its closure, its defaults and, for a bound
  method, its object's attributes, and so on into the Python functions it calls (however
  deep, each once) and what it reads attributes of (objects, their slots and properties'
  code, modules, classes) or items of (lists, tuples, dicts). Numbers, strings and tuples of
  them are compared by value, bit for bit (``exact``), arrays by identity and contents,
  anything else by identity;
- every Module those lead to (also through an optimizer's parameters' owners is not possible:
  an optimizer holds only parameters), and every object holding buffers: each attribute, by
  value for numbers, by identity for the rest (``snapshot``), so replacing a parameter, adding a
  layer or changing ``dropout.p`` records again; the functions a Module keeps (a lambda in a
  Sequential) are read as the step's.
"""
import contextvars
import dataclasses
import dis
import functools
import inspect
import sys
import types

import numpy

from .. import backend
from ..core import NetVar
from ..module import Module, walk
from ..optim.base import Optimizer
from ..optim.flat import FlatParameter
from .guards import _LONGEST, _MISSING, _SEQUENCES, _VALUES, _items, _shallow, guard

_ndarray = numpy.ndarray
# functions of these are not read (nnkit's own code is the ops'); objects of the foreign ones
# are not looked into (an nnkit object a step reads, a learning-rate schedule, is)
_FOREIGN = frozenset(("numpy", "builtins", "math", "functools", "itertools", "torch"))
_SKIPPED_MODULES = _FOREIGN | {"nnkit"}
# code not read as the step's: nnkit's, the libraries' and the standard library's (logging,
# copy, json: their own state is not the step's settings)
_LIBRARIES = _FOREIGN | frozenset(sys.stdlib_module_names)
_SKIPPED_CODE = _LIBRARIES | {"nnkit"}
_DEEPEST = 16       # calls and attributes followed before the step runs (world.meet: as it runs)
_DYNAMIC = frozenset(("getattr", "vars", "__dict__"))   # code that reads attributes by name


class World:
    """The models, optimizers, parameters and buffers a step can reach, and the guards."""

    def __init__(self, fn, inputs):
        self.guards = []        # (description, read, expected, how): how is "value" or "is"
        self.modules, self.optimizers, self.owners = [], [], []
        self.leaves = []        # NetVars reachable before the step (parameters and constants)
        self.objects = []       # objects read by name at run time: compared attribute by attribute
        self._seen, self._seen_names, self._kept = set(), {}, []    # what was read, once
        self._met, self._read = {}, set()   # code met while running (its names), read before
        self._methods = {}      # (class, name) -> the function of a Module's or optimizer's
        # method that ran (one guard compares them all: _method_ran)
        for position, value in enumerate(inputs):
            self._visit(value, f"input {position}", None, depth=0)
        self._read_function(fn, _name(fn), depth=0)
        owned = set()           # ids of the models' and optimizers' own nodes
        for module in list(self.modules):
            for name, kind, value in walk(module):
                if kind == "module":
                    self._add(value, self.modules)
                    forward = type(value).forward
                    if not _skipped(type(value).__module__, _SKIPPED_MODULES):
                        self._read_function(types.MethodType(forward, value),
                                            f"{type(value).__name__}.forward", depth=1)
                    for attribute, held in vars(value).items():    # a Sequential's lambda
                        if isinstance(held, (types.FunctionType, list, tuple, dict)):
                            self._visit(held, f"{type(value).__name__}.{attribute}", None, 1)
                elif kind in ("var", "constant"):
                    self._add(value, self.leaves)
                    owned.add(id(value))
                elif kind == "buffer":
                    self._add(value[0], self.owners)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self._add(p, self.leaves)
                    owned.add(id(p))
        # a node given as an input is an input (copied in at each call), not a parameter: a
        # parameter given as one is refused (first_call.record)
        self.inputs_held = [k for k, x in enumerate(inputs) if id(x) in owned]
        self.leaves = [leaf for leaf in self.leaves if all(leaf is not x for x in inputs)]
        # a buffer the step names (bn.stats.running_mean) is the step's state, handed in at
        # each replay as it is then (an entry): no guard of its contents
        buffers = {id(getattr(owner, name, None)) for owner in self.owners
                   for name in type(owner).buffers}
        self.guards = [guard for guard in self.guards
                       if not (guard[3] == "array" and id(guard[2][0]) in buffers)]

    def meet(self, frame, live=False):
        """A Python frame the step runs while it records (a profile hook calls this at each
        call): at its code's first call, the globals it reads (unless read before the step
        ran); at every call, its arguments, read with its names as ``_read_function`` reads
        the step's own (a settings object handed to a helper, the object of a ``__call__``,
        a class method's class, a partial's keywords). In a ``live`` frame, one an optimizer's
        step runs (a modifier's), which every replay runs again, a list or tuple of arrays
        is that call's own (the gradients), not a value to guard."""
        code = frame.f_code
        self._method_ran(frame)
        names = self._met.get(code)
        first = names is None
        if first:
            skipped = _skipped(frame.f_globals.get("__name__", ""), _SKIPPED_CODE)
            names = self._met[code] = () if skipped else _attribute_names(code)
        if names:
            self._kept_as_found(self._read_frame, frame, names, first and code not in self._read,
                                live)

    def _method_ran(self, frame):
        """A method of a Module or an optimizer that ran (nnkit's own too, whose code is not
        read: ``TransformerEncoderLayer._drop`` run by its forward): the function its class
        gives that name is guarded, so a method replaced on the class records again."""
        code = frame.f_code
        if not code.co_argcount:
            return
        owner = frame.f_locals.get(code.co_varnames[0])
        if not isinstance(owner, (Module, Optimizer)):
            return
        cls, name = type(owner), code.co_name
        if (cls, name) in self._methods:
            return
        function = getattr(cls, name, None)     # (a function: a class gives it as it is)
        if getattr(function, "__code__", None) is code and not str(
                function.__module__).startswith(__package__):  # (not the recording's own hook)
            if not self._methods:
                self.guards.append(("a method of the step's Modules or optimizers",
                                    self._methods_now, self._methods, "equal"))
            self._methods[cls, name] = function

    def _methods_now(self):
        return {(cls, name): getattr(cls, name, None) for cls, name in self._methods}

    def _read_frame(self, frame, names, globals_too, live):
        where = _where(frame.f_code)
        if globals_too:
            self._read_code(frame.f_code, frame.f_globals, where, 1, names)
        for name, value in frame.f_locals.items():
            if live and isinstance(value, (list, tuple)) and all(
                    item is None or backend.is_array(item) for item in value):
                continue
            self._visit(value, f"{where}: argument {name}", None, 2,
                        _own_names(value, frame.f_code, names))

    def met_return(self, frame, value):
        """What a function of the step's returned (``cfg = get_config()``), read with the
        names of the code it returns to."""
        caller = frame.f_back
        if self._met.get(frame.f_code) and caller is not None and \
                self._met.get(caller.f_code):
            self._kept_as_found(self._visit, value, f"{_where(frame.f_code)}: its result", None,
                                2, self._met[caller.f_code])

    def _kept_as_found(self, read, *args):
        """``read(*args)`` while the step runs: guards and objects only, no new parameter,
        Module or optimizer (what the step was handed is fixed by then)."""
        found = self.leaves[:], self.modules[:], self.optimizers[:], self.owners[:]
        try:
            read(*args)
        finally:
            self.leaves, self.modules, self.optimizers, self.owners = found

    def _add(self, value, found):
        if all(item is not value for item in found):
            found.append(value)

    # -- the Python the step reads
    def _read_function(self, fn, where, depth):
        # a bound method is made anew at each reading: its function and object are the key
        key = (id(fn.__func__), id(fn.__self__)) if isinstance(fn, types.MethodType) else id(fn)
        if key in self._seen or depth > _DEEPEST:
            return
        self._seen.add(key)
        self._kept.append(fn)               # its id stays its own while the world is built
        if isinstance(fn, types.MethodType):
            code = fn.__func__.__code__
            self._visit(fn.__self__, f"{where}.__self__", None, depth + 1,
                        _own_names(fn.__self__, code, _attribute_names(code)))
            fn = fn.__func__
        if not isinstance(fn, types.FunctionType):
            if callable(fn) and not isinstance(fn, type):
                self._visit(fn, where, None, depth + 1,
                            _attribute_names(type(fn).__call__.__code__)
                            if isinstance(getattr(type(fn), "__call__", None),
                                          types.FunctionType) else ())
            return
        code = fn.__code__
        names = _attribute_names(code)
        self._read.add(code)
        self._read_code(code, fn.__globals__, where, depth, names)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            self._visit_read(lambda c=cell: c.cell_contents, f"{where}: {name} (closure)",
                             depth, names)
        for index, value in enumerate(fn.__defaults__ or ()):
            self._visit_read(lambda f=fn, i=index: f.__defaults__[i],
                             f"{where}: default {index}", depth, names)
        for name in fn.__kwdefaults__ or ():
            self._visit_read(lambda f=fn, n=name: f.__kwdefaults__[n],
                             f"{where}: default {name}", depth, names)
        if fn.__dict__:                     # its own attributes (step.calls, a counter)
            self._visit_attributes(fn, where, depth, names)

    def _read_code(self, code, globals_, where, depth, names):
        """The globals ``code`` reads (all of them when it calls ``globals()``) and the
        modules it imports."""
        read = set(globals_) if "globals" in names else _global_names(code)
        for name in read:
            if name in globals_ and not name.startswith("__"):
                self._visit_read(lambda g=globals_, n=name: g[n], f"{where}: global {name}",
                                 depth, names)
        for name in _imported(code):
            if name in sys.modules:
                self._visit_read(lambda n=name: sys.modules[n], f"{where}: import {name}",
                                 depth, names)

    def _visit_read(self, read, where, depth, names):
        try:
            value = read()
        except (KeyError, ValueError):      # an empty cell: the step assigns it later
            return
        self._guard(where, read, value)
        self._visit(value, where, read, depth + 1, names)

    def _visit(self, value, where, read, depth, names=()):
        if isinstance(value, Module):
            self._add(value, self.modules)
            if depth < _DEEPEST:        # what its own code names: its methods, a settings object
                self._visit_attributes(value, where, depth, names)
        elif isinstance(value, Optimizer):
            self._add(value, self.optimizers)
            if depth < _DEEPEST:        # what the code names: its rate, its groups
                self._visit_attributes(value, where, depth, names)
        elif isinstance(value, NetVar):
            if getattr(value, "_parents", None) == ():     # (unset: an op's own __init__ met)
                self._add(value, self.leaves)
        elif isinstance(value, FlatParameter):     # a run of parameters an optimizer updates
            pass
        elif isinstance(value, (list, tuple, dict)):
            if depth < _DEEPEST and len(value) <= _LONGEST:
                for key, item in _items(value).items():
                    # contents, as bare ones (not a recording's own arrays: an *args's)
                    if isinstance(item, (list, dict, set)) or type(item) is _ndarray:
                        self._guard(f"{where}[{key!r}]", lambda c=value, k=key: c[k], item)
                    if not isinstance(item, _VALUES):
                        self._visit(item, f"{where}[{key!r}]", None, depth + 1, names)
        elif isinstance(value, (types.FunctionType, types.MethodType)):
            if getattr(value, "__module__", "") and not _skipped(value.__module__,
                                                                 _SKIPPED_CODE):
                self._read_function(value, f"{where}", depth)
        elif type(value) is _ndarray and value.dtype == object and value.size <= _LONGEST:
            for index, item in enumerate(value.flat):       # settings objects in an array
                if not isinstance(item, _VALUES):
                    self._visit(item, f"{where}.flat[{index}]", None, depth + 1, names)
        elif isinstance(value, contextvars.ContextVar):     # its value in this context
            self._guard(f"{where}.get()", lambda v=value: v.get(_MISSING), value.get(_MISSING))
        elif isinstance(value, functools.partial):      # its function, arguments and keywords
            self._guard(f"{where}.args", lambda p=value: p.args, value.args)
            self._guard(f"{where}.keywords", lambda p=value: p.keywords, value.keywords)
            for part in (value.func, value.args, value.keywords):
                self._visit(part, where, None, depth + 1, names)
        elif isinstance(value, (type, types.ModuleType)):
            # a settings module or class: the attributes the step's code names (nnkit's and
            # the foreign libraries' own are not read)
            own = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
            if depth < _DEEPEST and not _skipped(own, _SKIPPED_MODULES):
                self._visit_attributes(value, where, depth, names)
        elif isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
            self._visit(value.__wrapped__, where, None, depth + 1)   # lru_cache, wraps
        elif not isinstance(value, _VALUES + (_ndarray, set) + _SEQUENCES) \
                and depth < _DEEPEST and not _skipped(type(value).__module__, _FOREIGN):
            if _DYNAMIC.intersection(names) or dataclasses.is_dataclass(value):
                self._hold(value, depth)    # read by a name in a string (asdict, match too)
            self._visit_attributes(value, where, depth, names)

    def _hold(self, value, depth):
        """Compare ``value``'s attributes, all of them, at every replay (``held``), and those
        of the plain objects among them (a section of a settings object)."""
        if not hasattr(value, "__dict__") or any(value is held for held in self.objects):
            return
        self.objects.append(value)
        for attribute in vars(value).values():
            if depth < _DEEPEST and not isinstance(
                    attribute, (Module, Optimizer, NetVar, type, types.ModuleType,
                                types.FunctionType, types.MethodType) + _VALUES) \
                    and not _skipped(type(attribute).__module__, _FOREIGN):
                self._hold(attribute, depth + 1)

    def _visit_attributes(self, value, where, depth, names):
        """The attributes of ``value`` (an object, a class or a module) that the step's code
        names: guarded and visited; a method's, a property's or a static method's code read."""
        _, seen = self._seen_names.setdefault(id(value), (value, set()))   # (kept alive)
        names = frozenset(names) - seen
        seen |= names                       # each attribute of an object read once
        for name in names:
            try:
                static = inspect.getattr_static(value, name)
            except AttributeError:
                continue
            if isinstance(static, (staticmethod, classmethod)):
                static = static.__func__
            if isinstance(static, types.FunctionType):      # cfg.get(): its code too
                nnkits = isinstance(value, (Module, Optimizer))     # (nnkit's code: not read)
                skipped = _SKIPPED_CODE if nnkits else _LIBRARIES
                if not _skipped(static.__module__, skipped):
                    bound = isinstance(value, (type, types.ModuleType)) or isinstance(
                        inspect.getattr_static(type(value), name, None), staticmethod)
                    self._read_function(static if bound else types.MethodType(static, value),
                                        f"{where}.{name}()", depth + 1)
                    reader = (lambda o=value, n=name: getattr(o, n))   # which function it is
                    self.guards.append((f"{where}.{name}", reader, reader(), "equal"))
                continue
            if isinstance(static, property):                # its getter's code (not nnkit's
                if isinstance(static.fget, types.FunctionType) and not (   # on its own classes)
                        isinstance(value, (Module, Optimizer))
                        and _skipped(static.fget.__module__, _SKIPPED_CODE)):
                    self._read_function(types.MethodType(static.fget, value),
                                        f"{where}.{name}", depth + 1)
                continue
            reader = (lambda o=value, n=name: getattr(o, n))    # a slot or a class's too
            try:
                attribute = reader()
            except Exception:       # noqa: BLE001 (a descriptor that refuses: not read)
                continue
            self._guard(f"{where}.{name}", reader, attribute)
            self._visit(attribute, f"{where}.{name}", reader, depth + 1, names)

    def _guard(self, where, read, value):
        self.guards.append(guard(where, read, value))

    # -- Modules and buffer owners, attribute by attribute
    def held(self):
        """Every attribute value of the Modules and buffer owners (and the items of their lists
        and dicts), in order: when each is the very object it was, nothing changed (the quick
        check before ``snapshot``'s comparison)."""
        values = [type(module) for module in self.modules] + [
            getattr(type(module), "forward", None) for module in self.modules]  # (replaced?)
        for holder in self.modules + self.owners + self.objects:
            skip = _changing(holder)
            for name, value in vars(holder).items():
                if name not in skip:
                    values.append(value)
                    if isinstance(value, dict):
                        values.extend(item for pair in value.items() for item in pair)
                    elif isinstance(value, list):
                        values.extend(value)
        return values

    def snapshot(self, optimizers=False):
        """Each Module's and buffer owner's attributes: numbers by value, the rest by identity
        (lists and dicts item by item). With ``optimizers``, each optimizer's options and
        parameter groups too: a step must not change them (a schedule stepped inside it would
        be stepped by no replay); between calls they are read live, so not compared then."""
        held = [(holder, _shallow(_with_class(holder), _changing(holder)))
                for holder in self.modules + self.owners + self.objects]
        if optimizers:
            for optimizer in self.optimizers:
                # (its runs of small parameters are made by a first step: optim/flat.py)
                held.append((optimizer, _shallow(_as_floats(vars(optimizer)), ("_flat_runs",))))
                held.extend((group, _shallow(_as_floats(group)))
                            for group in optimizer.param_groups)
        return held


def _with_class(holder):
    """A holder's attributes, and for a Module its class and its class's ``forward`` (a
    forward replaced on the class, or the object given another class)."""
    if not isinstance(holder, Module):
        return vars(holder)
    return dict(vars(holder), __class__=type(holder),
                __forward__=getattr(type(holder), "forward", None))


def op_classes(world, classes):
    """Guards on the floats the op classes a recording met keep as class attributes
    (``CELoss.eps``, ``GELU.c``): nnkit's code reads them, a step's code need not name them.
    (Their ints and booleans are what an op is, ``n_outputs``, not settings.)"""
    for cls in classes:
        names = {name for klass in cls.__mro__ for name, value in vars(klass).items()
                 if not name.startswith("__") and isinstance(value, (float, numpy.floating))}
        for name in sorted(names):
            read = (lambda c=cls, n=name: getattr(c, n))
            world._guard(f"{cls.__name__}.{name}", read, read())


def _as_floats(options):
    """An optimizer's options with NumPy floats as Python floats, as its step() makes them
    (``lr=np.float32(0.01)``): that is no change the step makes."""
    return {key: float(value) if isinstance(value, numpy.floating) else value
            for key, value in options.items()}


def _changing(holder):
    """The attributes a step changes by design: an owner's buffers and counters (NetOp), a
    Module's nodes of its last call (``last_call``)."""
    if isinstance(holder, Module):
        return type(holder).last_call
    return getattr(type(holder), "buffers", ()) + getattr(type(holder), "counters", ())


def _where(code):
    return getattr(code, "co_qualname", code.co_name)


def _skipped(module, packages):
    """Whether the module named ``module`` belongs to one of ``packages`` (not "mathconfig"
    to "math")."""
    return str(module).partition(".")[0] in packages


def _global_names(code):
    names = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _imported(code):
    """The modules ``code`` imports inside itself (``import settings`` in a function)."""
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname == "IMPORT_NAME"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _imported(const)
    return names


def _own_names(value, code, names):
    """``names``, the attribute names ``code`` reads, as read of ``value``: less the nodes a
    Module's forward sets for reading after the call (``last_call``) when ``code`` is that
    forward and sets each before anything else names it, jumps or names attributes by
    string (the step's own code naming them is guarded: it would read the call before's)."""
    if not isinstance(value, Module) or not type(value).last_call or code is not getattr(
            getattr(type(value), "forward", None), "__code__", None):
        return names
    return set(names) - _set_first(code, type(value).last_call)


def _set_first(code, attributes):
    """Those of ``attributes`` that ``code`` stores before it reads them, jumps or reads an
    attribute by its name in a string (``getattr``): what it reads then is this call's."""
    first = set()
    for instruction in dis.get_instructions(code):
        name = instruction.argval if isinstance(instruction.argval, str) else None
        if "JUMP" in instruction.opname or instruction.opname == "FOR_ITER" or name in _DYNAMIC:
            break
        if name in attributes and name not in first:
            if instruction.opname != "STORE_ATTR":
                break
            first.add(name)
    return first


def _attribute_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _attribute_names(const)
    return names


def _name(fn):
    return getattr(fn, "__qualname__", None) or type(fn).__name__
