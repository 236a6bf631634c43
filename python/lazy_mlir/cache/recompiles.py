"""Why a group compiled again, and where a group keeps compiling.

Groups that differ only in sizes, layouts or guarded scalar values form one
family (``group_key.family``: same ops, same user source lines). Every
variant a family gets (compiled, or loaded from the cache) is remembered
for the life of the process; a compile in a family that already has one is
explained against its nearest variant: which inputs changed shape, strides,
dtype, device, aliasing or guarded value, which constants LTC traced
changed (sizes of views, scalars it did not make inputs), which
configuration fields changed, and the user line whose step triggered it. Explanations go to the metrics (``report()``) and, with
``LAZY_MLIR_LOG=recompiles``, to stderr as they happen. A family with more
than ``Config.recompile_limit`` variants warns once.
"""
from __future__ import annotations

import dataclasses
import sys
import warnings

import torch

from .. import config
from ..lowering.size_constants import size_constant_nodes
from ..observe import metrics
from ..observe.syncs import short_source, user_source
from .group_key import input_signature, tensor_digest

_FIELDS = ("shape", "strides", "dtype", "device", "aliasing")
_MAX_CHANGES = 4  # inputs listed per explanation; the rest are counted


@dataclasses.dataclass
class _Variant:
    name: str
    signature: tuple
    guards: dict  # input position -> value baked into the code
    constants: tuple  # each used prim::Constant's value, as text, in graph order
    config_key: str  # Config.key(): "field=value;..."


@dataclasses.dataclass
class _Family:
    variants: list = dataclasses.field(default_factory=list)
    warned: bool = False


_families: dict[str, _Family] = {}


def _user_of(value: torch._C.Value) -> str:
    """'aten::mm at model.py:12 (forward)': the op that reads ``value``, past
    the scalar conversions LTC inserts (they carry no source line)."""
    for _ in range(4):
        users = [u.user for u in value.uses()]
        if not users:
            return "nothing"
        user = next((u for u in users if u.hasAttribute("source")), users[0])
        if user.hasAttribute("source") or user.outputsSize() != 1:
            break
        value = user.output()
    where = f" at {short_source(user.s('source'))}" if user.hasAttribute("source") else ""
    return f"{user.kind()}{where}"


def _input_name(graph: torch._C.Graph, i: int) -> str:
    return f"input {i} (used by {_user_of(list(graph.inputs())[i])})"


def _used_constants(graph: torch._C.Graph) -> list:
    return [n for n in graph.nodes() if n.kind() == "prim::Constant" and n.output().uses()]


def _constants(graph: torch._C.Graph) -> tuple:
    values = []
    for node in _used_constants(graph):
        value = node.output().toIValue()
        if isinstance(value, torch.Tensor):
            value = f"tensor{tuple(value.shape)} {value.dtype} #{tensor_digest(value)[:8]}"
        values.append(repr(value))
    return tuple(values)


def _constant_users(graph: torch._C.Graph) -> list[str]:
    return [_user_of(n.output()) for n in _used_constants(graph)]


def size_constant_user(graph: torch._C.Graph, k: int) -> str:
    """The op reading the ``k``-th size constant (``size_constants``'s order)."""
    return _user_of(size_constant_nodes(graph)[k].output())


def _aliasing(same_as) -> str:
    return "its own tensor" if same_as is None else f"the tensor of input {same_as}"


def _input_changes(old: tuple, new: tuple) -> list[tuple[int, str]]:
    changes = []
    for i, (a, b) in enumerate(zip(old, new)):
        diffs = []
        for field, x, y in zip(_FIELDS, a, b):
            if x != y:
                if field == "aliasing":
                    x, y = _aliasing(x), _aliasing(y)
                diffs.append(f"{field} {x} -> {y}")
        if diffs:
            changes.append((i, ", ".join(diffs)))
    return changes


def _config_changes(old: str, new: str) -> list[tuple]:
    before = dict(field.split("=", 1) for field in old.split(";") if "=" in field)
    after = dict(field.split("=", 1) for field in new.split(";") if "=" in field)
    return [("config", -1, f"config {k} {before.get(k)} -> {after.get(k)}")
            for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


def _differences(variant: _Variant, signature: tuple, inputs: list, constants: tuple, config_key: str) -> list:
    """What changed from ``variant`` to this group and these inputs:
    ("input", position, what), ("constant", position, what), ("group" or "config", -1, what)."""
    if len(variant.signature) != len(signature):
        return [("group", -1, f"{len(signature)} inputs instead of {len(variant.signature)}")]
    changes = _config_changes(variant.config_key, config_key)
    changes += [("input", i, what) for i, what in _input_changes(variant.signature, signature)]
    changed = {i for _, i, _ in changes}
    for i, value in sorted(variant.guards.items()):
        if i not in changed and inputs[i].item() != value:
            changes.append(("input", i, f"value {value} -> {inputs[i].item()} (baked into the code)"))
    if len(variant.constants) != len(constants):
        changes.append(("group", -1, f"{len(constants)} constants instead of {len(variant.constants)}"))
    else:
        changes += [("constant", i, f"{a} -> {b}")
                    for i, (a, b) in enumerate(zip(variant.constants, constants)) if a != b]
    return sorted(changes, key=lambda c: (c[0] != "config", c[0] != "input", c[1]))


def _distance(changes: list) -> int:
    return (1 << 30) if any(kind == "group" and "inputs" in what for kind, _, what in changes) else len(changes)


def _describe_changes(graph: torch._C.Graph, changes: list) -> list[str]:
    users = _constant_users(graph) if any(kind == "constant" for kind, _, _ in changes) else []
    described = []
    for kind, i, what in changes[:_MAX_CHANGES]:
        if kind == "input":
            described.append(f"{_input_name(graph, i)}: {what}")
        elif kind == "constant":
            described.append(f"constant used by {users[i]}: {what}")
        else:
            described.append(what)
    if len(changes) > _MAX_CHANGES:
        described.append(f"and {len(changes) - _MAX_CHANGES} more changes")
    return described


def before_compile(family: str, graph: torch._C.Graph, inputs: list, name: str, describe: str,
                   cfg: config.Config, config_key: str, not_generic: str | None = None) -> None:
    """Called when a group misses every cache: explains it if its family has
    compiled before (and, in ``not_generic``, why it compiles for these
    sizes only)."""
    known = _families.get(family)
    if known is None or not known.variants:
        return
    signature, constants = input_signature(inputs), _constants(graph)
    nearest, changes = min(((v, _differences(v, signature, inputs, constants, config_key)) for v in known.variants),
                           key=lambda vc: _distance(vc[1]))
    described = _describe_changes(graph, changes) or [
        "nothing differs from it (lowered afresh: dump_dir is set, or its cache entry was unusable)"]
    record = {"group": name, "ops": describe, "step_source": user_source(), "previous": nearest.name,
              "changes": described}
    if not_generic:
        record["not_shape_generic"] = not_generic
    metrics.record_recompile(record)
    if cfg.logs("recompiles"):
        print(f"lazy_mlir: recompiling {metrics.format_recompile(record)}", file=sys.stderr, flush=True)


def add_variant(family: str, graph: torch._C.Graph, name: str, inputs: list, guards: list, describe: str,
                cfg: config.Config, config_key: str) -> None:
    """A variant this family now has (compiled or from the cache); warns once
    when the family passes ``cfg.recompile_limit``."""
    known = _families.setdefault(family, _Family())
    variant = _Variant(name, input_signature(inputs), dict(guards), _constants(graph), config_key)
    if any(dataclasses.astuple(v)[1:] == dataclasses.astuple(variant)[1:] for v in known.variants):
        return
    known.variants.append(variant)
    if len(known.variants) > cfg.recompile_limit and not known.warned:
        known.warned = True
        warnings.warn(f"lazy_mlir: group {name} [{describe}] has compiled {len(known.variants)} variants "
                      f"(more than recompile_limit={cfg.recompile_limit}): its input sizes, layouts or scalar "
                      "values keep changing; LAZY_MLIR_LOG=recompiles prints why each one compiled",
                      RuntimeWarning, stacklevel=2)


def variants(family: str) -> int:
    known = _families.get(family)
    return len(known.variants) if known else 0
