"""What a captured forward may depend on besides its tensors, and what it
may not do (``capture``'s soundness).

A replay runs none of the forward's Python: what that Python decided at
record time from Python values (an attribute, a global, a draw from
Python's random) is replayed as decided. The values it may read are part of
a record's key (plain ones: see ``_plain``): the module tree's plain
attributes and the globals user code read (``NamedState``, checked at every
call in one C++ call); what it writes (attributes, globals, buffers, draws
from Python's or NumPy's global random generators) makes capture refuse the
record, with the state restored (``PythonState``).

Why one module of ~530 lines: what a record may read (the key's values and
their cheap check) and what it may not write (the watch around a record)
walk the same state, modules' dicts, their objects' fields and the globals
user code reads, and must agree on what "plain" and "the user's code" are.
"""
from __future__ import annotations

import dis
import importlib.util
import os
import random
import sys
import sysconfig
import types

import torch

from ..native import _C

# A replay runs none of the forward's Python: what that Python decided at
# record time from Python values (an attribute, a global, a draw from
# Python's random) is replayed as decided. The values it may read are part
# of the key (plain ones: see _plain); what it writes makes it refuse.
_SCALARS = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device})
_TUPLES = (tuple, torch.Size)
_MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()  # a global that is not there


def _plain(value) -> bool:
    """A value a forward may branch on and a key can hold: a scalar (bool,
    int, float, str, None, a torch dtype or device) or a tuple of them."""
    kind = type(value)
    return kind in _SCALARS or (kind in _TUPLES and all(_plain(v) for v in value))


def _typed(value):
    """A plain ``value`` with its type: 1, 1.0 and True are equal, but a
    forward may tell them apart."""
    if type(value) in _TUPLES:
        return type(value), tuple(_typed(v) for v in value)
    return type(value), value


class Values:
    """Plain values in a record's key, hashed once: a module tree's plain
    attributes are hundreds, and a key is hashed at every call."""

    __slots__ = ("values", "hash")

    def __init__(self, values: tuple):
        self.values, self.hash = values, hash(values)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        return self is other or (type(other) is Values and self.hash == other.hash and self.values == other.values)

    def __repr__(self):
        return f"Values{self.values!r}"


# Code in these is not the user's: its globals are not watched, and a draw
# it makes is not the user's line. (Third-party model code, transformers'
# or timm's, is the user's: its module flags decide what a forward does.)
_LIBRARIES = ("torch", "functorch", "torchgen", "sympy", "mpmath", "networkx", "optree", "typing_extensions",
              "filelock", "jinja2", "markupsafe", "fsspec", "triton", "numpy")
_library_prefixes: tuple | None = None
_stdlib_prefixes = tuple({os.path.join(p, "") for p in (sysconfig.get_paths()["stdlib"],
                                                        sysconfig.get_paths()["platstdlib"])})
_file_kinds: dict[str, str] = {}


def _file_kind(filename: str) -> str:
    """"user", "stdlib" or "library" (torch, lazy_mlir, torch's dependencies,
    and code torch's FX generates)."""
    kind = _file_kinds.get(filename)
    if kind is None:
        global _library_prefixes
        if _library_prefixes is None:
            prefixes = [os.path.join(os.path.dirname(os.path.dirname(__file__)), "")]  # the lazy_mlir package
            for name in _LIBRARIES:
                try:
                    spec = importlib.util.find_spec(name)
                except (ImportError, ValueError):
                    spec = None
                if spec is not None and spec.submodule_search_locations:
                    prefixes.extend(os.path.join(p, "") for p in spec.submodule_search_locations)
                elif spec is not None and spec.origin:
                    prefixes.append(spec.origin)
            _library_prefixes = tuple(prefixes)
        if filename.startswith(_library_prefixes) or filename.startswith(("<eval_with_key>", "<frozen ")):
            kind = "library"
        elif (filename.startswith(_stdlib_prefixes) and os.sep + "site-packages" + os.sep not in filename
              and os.sep + "dist-packages" + os.sep not in filename):
            kind = "stdlib"
        else:
            kind = "user"
        _file_kinds[filename] = kind
    return kind


class _Names:
    """The globals a code object reads and writes, by ``dis``: ``loads``,
    names of LOAD_GLOBAL; ``attributes``, (global, attribute) of a module's
    attribute read as ``config.FLAG``; ``writes``, (global, attribute or
    None, line) of STORE_GLOBAL/DELETE_GLOBAL and of ``config.FLAG = ...``."""

    def __init__(self, code):
        self.loads, self.attributes, self.writes = set(), set(), []
        previous = None
        for ins in dis.get_instructions(code):
            op = ins.opname
            line = ins.positions.lineno if getattr(ins, "positions", None) else ins.starts_line
            if op == "LOAD_GLOBAL":
                self.loads.add(ins.argval)
            elif op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                self.writes.append((ins.argval, None, line))
            elif previous is not None and previous.opname == "LOAD_GLOBAL":
                if op in ("LOAD_ATTR", "LOAD_METHOD"):
                    self.attributes.add((previous.argval, ins.argval))
                elif op in ("STORE_ATTR", "DELETE_ATTR"):
                    self.writes.append((previous.argval, ins.argval, line))
            previous = ins


_names_of: dict[int, tuple] = {}  # id(code) -> (code, its _Names)


def _names(code) -> _Names:
    known = _names_of.get(id(code))
    if known is None or known[0] is not code:
        known = _names_of[id(code)] = (code, _Names(code))
    return known[1]


def _user_module_dict(value) -> dict | None:
    """The globals of ``value`` if it is a module of the user's."""
    if isinstance(value, types.ModuleType) and _file_kind(getattr(value, "__file__", None) or "<builtin>") == "user":
        return value.__dict__
    return None


def _same(a, b) -> bool:
    """Equal states of a random generator (NumPy's hold arrays)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a).__module__ == "numpy":
        return a.shape == b.shape and bool((a == b).all())
    return a == b


def _random_types() -> tuple:
    """Python's random generators, and NumPy's if NumPy is loaded."""
    np_random = sys.modules.get("numpy.random")
    extra = (np_random.RandomState, np_random.Generator) if np_random is not None else ()
    return (random.Random, *extra)


def _generator_state(generator):
    if isinstance(generator, random.Random):
        return generator.getstate()
    if hasattr(generator, "get_state"):  # numpy.random.RandomState
        return generator.get_state()
    return generator.bit_generator.state  # numpy.random.Generator


def _set_generator_state(generator, state) -> None:
    if isinstance(generator, random.Random):
        generator.setstate(state)
    elif hasattr(generator, "set_state"):
        generator.set_state(state)
    else:
        generator.bit_generator.state = state


def _generator_name(generator) -> str:
    if generator is random._inst:
        return "Python's random"
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and generator is getattr(np_random.mtrand, "_rand", None):
        return "NumPy's random"
    return f"a {type(generator).__module__}.{type(generator).__name__}"


_STATE_DICTS = ("_parameters", "_buffers", "_modules")  # their entries are named as attributes


def _contents(value):
    """A shallow copy of a list, dict or set attribute (None for others)."""
    try:
        if isinstance(value, list):
            return list(value)
        if isinstance(value, dict):
            return dict(value)
        if isinstance(value, (set, frozenset)):
            return set(value)
    except Exception:  # noqa: BLE001 - a container that cannot be copied is compared by identity only
        pass
    return None


def _same_item(a, b) -> bool:
    return a is b or (_plain(a) and _plain(b) and _typed(a) == _typed(b))


def _same_contents(before, now) -> bool:
    if isinstance(before, list):
        return len(before) == len(now) and all(_same_item(a, b) for a, b in zip(before, now))
    if isinstance(before, dict):
        return len(before) == len(now) and all(k in now and _same_item(v, now[k]) for k, v in before.items())
    return before == set(now)


class PythonState:
    """What a forward does to Python state while it is recorded (AOTAutograd
    runs it twice): its modules' attributes, Python's and NumPy's random
    generators, globals. Built before the record; ``changes()`` after it
    names what changed, ``restore()`` puts it back. Inside ``with``, a
    profile function (``sys.setprofile``) sees the user code that runs
    (``guards()``: the plain globals it reads), the globals it may write
    (their values at its first call), and the generators drawn from (and
    from which line)."""

    def __init__(self, module: torch.nn.Module):
        self.name = type(module).__name__
        self.assigned: set[str] = set()  # the parameters and buffers the forward assigned (see _record)
        self.modules = []  # (module, its __dict__ then, copies of its containers then)
        for m in module.modules():
            attributes = dict(m.__dict__)
            self.modules.append((m, attributes, {k: c for k, v in attributes.items()
                                                 if (c := _contents(v)) is not None}))
        self.random_types = _random_types()
        self.generators: dict[int, list] = {}  # id -> [generator, its state then, first user line drawn from]
        self._generator(random._inst)
        np_random = sys.modules.get("numpy.random")
        if np_random is not None and getattr(np_random.mtrand, "_rand", None) is not None:
            self._generator(np_random.mtrand._rand)
        self.codes: dict[int, tuple] = {}  # id(code) -> (code, its frame's globals, or None: not user code)
        self.writes: dict[tuple, tuple] = {}  # (id(dict), name) -> (dict, name, value then, where, label)
        self.previous = self.resume = None

    def _generator(self, generator) -> list:
        entry = self.generators.get(id(generator))
        if entry is None:
            entry = self.generators[id(generator)] = [generator, _generator_state(generator), None]
        return entry

    # ---------------------------------------------------------- the profile
    def __enter__(self):
        previous = sys.getprofile()
        if previous is not None and hasattr(previous, "disable") and hasattr(previous, "enable"):
            previous.disable()  # cProfile: not a function to chain; paused while recording
            self.resume = previous.enable
        else:
            self.previous = previous  # a Python profile function: called after ours
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self.previous)
        if self.resume is not None:
            self.resume()

    def _event(self, frame, event, arg):
        if event == "call":
            if id(frame.f_code) not in self.codes:
                self._first_call(frame)
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if owner is not None and isinstance(owner, self.random_types):
                self._draw(frame, owner)
        if self.previous is not None:
            self.previous(frame, event, arg)

    def _first_call(self, frame) -> None:
        code = frame.f_code
        if _file_kind(code.co_filename) != "user":
            self.codes[id(code)] = (code, None)
            return
        scope = frame.f_globals
        self.codes[id(code)] = (code, scope)
        try:
            for name, attribute, line in _names(code).writes:
                if attribute is None:
                    target, key, label = scope, name, name
                elif isinstance(scope.get(name), types.ModuleType):  # config.FLAG = ...
                    target, key, label = scope[name].__dict__, attribute, f"{name}.{attribute}"
                else:
                    continue
                if (id(target), key) not in self.writes:
                    self.writes[(id(target), key)] = (target, key, target.get(key, _MISSING),
                                                      f"{code.co_filename}:{line}", label)
        except Exception:  # noqa: BLE001 - never raise into the traced code
            pass

    def _draw(self, frame, generator) -> None:
        """A draw from ``generator`` (before it happens): the user's line
        that draws; a generator of the user's own, its state."""
        try:
            entry = self.generators.get(id(generator))
            if entry is not None and entry[2] is not None:
                return
            while frame is not None and _file_kind(frame.f_code.co_filename) == "stdlib":
                frame = frame.f_back  # random.choice's frames in random.py: the user's line calls it
            if frame is None or _file_kind(frame.f_code.co_filename) != "user":
                return  # a library's draw (from Python's random: still seen as a change)
            if entry is None:
                entry = self._generator(generator)
            entry[2] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        except Exception:  # noqa: BLE001 - never raise into the traced code
            pass

    # -------------------------------------------------------- after the record
    def changes(self) -> list[str]:
        found = []
        for m, before, contents in self.modules:
            now = m.__dict__
            for key in sorted(before.keys() | now.keys()):
                a, b = before.get(key, _MISSING), now.get(key, _MISSING)
                if key in _STATE_DICTS and a is b and key in contents:
                    found.extend(f"{type(m).__name__}.{n} attribute changed"
                                 for n in sorted(contents[key].keys() | b.keys())
                                 if contents[key].get(n, _MISSING) is not b.get(n, _MISSING))
                elif not (_same_item(a, b) and (key not in contents or _same_contents(contents[key], b))):
                    found.append(f"{type(m).__name__}.{key} attribute changed")
        for generator, before, where in self.generators.values():
            if not _same(_generator_state(generator), before):
                found.append(f"{_generator_name(generator)} was drawn from" + (f" at {where}" if where else ""))
        for target, key, before, where, label in self.writes.values():
            if not _same_item(before, target.get(key, _MISSING)):
                found.append(f"global {label} was written at {where}")
        found.extend(f"{self.name}.{name} attribute changed" for name in sorted(self.assigned))
        return found

    def drew(self) -> bool:
        """Whether a random generator was drawn from."""
        return any(not _same(_generator_state(g), before) for g, before, _ in self.generators.values())

    def restore(self) -> None:
        for m, before, contents in self.modules:
            now = m.__dict__
            for key in [k for k in now if k not in before]:
                del now[key]
            for key, value in before.items():
                if now.get(key, _MISSING) is not value:
                    now[key] = value
                copy = contents.get(key)
                if copy is not None and not _same_contents(copy, value):
                    if isinstance(value, list):
                        value[:] = copy
                    else:  # a dict or set (a frozenset is never changed)
                        value.clear()
                        value.update(copy)
        for generator, before, _ in self.generators.values():
            _set_generator_state(generator, before)
        for target, key, before, _, _ in self.writes.values():
            if before is _MISSING:
                target.pop(key, None)
            else:
                target[key] = before

    def guards(self) -> list[tuple[dict, str]]:
        """(globals, name) of each plain global the user code read (a
        module's attribute read as ``config.FLAG`` too, if the module is the
        user's)."""
        found = {}
        for code, scope in self.codes.values():
            if scope is None:
                continue
            names = _names(code)
            for name in names.loads:
                if name in scope and _plain(scope[name]):
                    found[(id(scope), name)] = (scope, name)
            for name, attribute in names.attributes:
                target = _user_module_dict(scope.get(name))
                if target is not None and attribute in target and _plain(target[attribute]):
                    found[(id(target), attribute)] = (target, attribute)
        return list(found.values())



_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)  # _parameters, the hooks' dicts...
# Attribute values whose __dict__ is not settings: code, classes, tensors, modules (walked as such).
_NOT_SETTINGS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                 torch.Tensor, torch.nn.Module)


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _hooks_a_replay_skips(order: list, dicts: list) -> tuple:
    """"name: kind" of each hook on a submodule (and of each global module
    hook) that is not lazy_mlir's own (``_lazy_mlir_internal``): a replay
    runs none of the submodules' calls, so their hooks would not run, and
    what they saw while recorded was fake. The hooks' dicts join ``dicts``:
    a hook added or removed walks again. (The root's hooks run at every
    call, around its captured forward.)"""
    from torch.nn.modules import module as nn_module

    found = []
    for kind in _HOOK_DICTS:
        hooks = getattr(nn_module, "_global" + kind)
        dicts.append(hooks)
        found.extend(f"global {kind[1:-1]}" for h in hooks.values() if not getattr(h, "_lazy_mlir_internal", False))
    for prefix, m in order:
        for kind in _HOOK_DICTS:
            hooks = getattr(m, kind)
            dicts.append(hooks)
            if prefix:
                found.extend(f"{prefix[:-1]}: {kind[1:-1]}" for h in hooks.values()
                             if not getattr(h, "_lazy_mlir_internal", False))
    return tuple(found)


def _fields_of(value) -> dict | None:
    """The attribute dict of an object a module holds (a model's config, a
    settings object), whose plain fields a forward may branch on as on the
    module's own attributes (``self.config.use_cache``); None for values
    without one (containers are not looked into)."""
    if isinstance(value, _NOT_SETTINGS):
        return None
    fields = getattr(value, "__dict__", None)
    return fields if type(fields) is dict else None


class NamedState:
    """``[*module.named_parameters(), *module.named_buffers()]`` at each
    call, with the plain attributes of the tree's modules (and the plain
    fields of the objects they hold: ``self.config``) and the values of
    the watched globals (``watch``; see :class:`PythonState`), without
    walking the module tree when nothing has changed (the walk was a third
    of a small model's capture overhead): the entries it read (dict, key,
    value: each submodule, parameter, buffer, attribute but nn.Module's own,
    and watched global) are checked to be still in place, and the dicts of
    the tree to hold nothing more, in one C++ call (``_C.StateEntries``:
    this runs at every call). An entry replaced by an equal value (``m.p =
    0.5`` again) walks again, and keeps its key."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.named: list = []
        self.tensors: list = []
        self.identity: tuple = ()  # (name, id) of each tensor: part of a record's key
        self.attributes = Values(())  # ("prefix.name", typed value) of each plain module attribute: in the key
        self.watched: list[tuple[dict, str]] = []  # (globals, name) that some record read
        self.globals = Values(())  # their typed values, in that order: in the key
        self.entries = None  # the last walk's _C.StateEntries
        self.hooks: tuple = ()  # hooks a replay would not call: see _hooks_a_replay_skips

    def get(self) -> list[tuple[str, torch.Tensor]]:
        if self.entries is None or not self.entries.unchanged():
            self._walk()
        return self.named

    def watch(self, guards: list[tuple[dict, str]]) -> int:
        """Watches the globals of ``guards`` not yet watched; returns how many."""
        known = {(id(scope), name) for scope, name in self.watched}
        new = [(scope, name) for scope, name in guards if (id(scope), name) not in known]
        if new:
            self.watched.extend(new)
            self.entries = None  # the next get() walks
        return len(new)

    def _walk(self) -> None:
        order, seen = [], {id(self.module)}  # (prefix, module), depth-first as named_modules()
        entries, dicts = [], []

        def walk(prefix, m):
            order.append((prefix, m))
            dicts.extend([m._modules, m._parameters, m._buffers, m.__dict__])
            for name, child in m._modules.items():
                entries.append((m._modules, name, child))
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    walk(f"{prefix}{name}.", child)

        walk("", self.module)
        self.hooks = _hooks_a_replay_skips(order, dicts)
        params, buffers, taken = [], [], set()
        for kind, out in (("_parameters", params), ("_buffers", buffers)):
            for prefix, m in order:
                d = getattr(m, kind)
                for name, t in d.items():
                    entries.append((d, name, t))
                    if t is not None and id(t) not in taken:
                        taken.add(id(t))
                        out.append((prefix + name, t))
        self.named = params + buffers
        self.tensors = [t for _, t in self.named]
        self.identity = tuple((name, id(t)) for name, t in self.named)
        attributes, held = [], set()
        for prefix, m in order:
            d = m.__dict__
            for name, value in d.items():
                if _plain(value):
                    entries.append((d, name, value))
                    attributes.append((prefix + name, _typed(value)))
                elif name not in _MODULE_INTERNALS:  # not in the key, but one made plain would be
                    entries.append((d, name, value))
                    fields = _fields_of(value)
                    if fields is not None and id(value) not in held:  # a config shared by every layer: once
                        held.add(id(value))
                        dicts.append(fields)
                        for field, v in fields.items():
                            entries.append((fields, field, v))
                            if _plain(v):
                                attributes.append((f"{prefix}{name}.{field}", _typed(v)))
        if tuple(attributes) != self.attributes.values:
            self.attributes = Values(tuple(attributes))
        values = []
        for scope, name in self.watched:
            if name in scope:
                entries.append((scope, name, scope[name]))
                # a watched global since made an object: keyed by identity (the entry holds it)
                values.append(_typed(scope[name]) if _plain(scope[name]) else (object, id(scope[name])))
            else:  # deleted: defined again, it changes the dict's length
                dicts.append(scope)
                values.append(_MISSING)
        if tuple(values) != self.globals.values:
            self.globals = Values(tuple(values))
        self.entries = _C.StateEntries(dicts, entries)
