"""Lowers lazy_mlir.zero's ``unshard`` markers to all-gathers, one per phase of use."""
from __future__ import annotations

import bisect
import dataclasses
import math

from torch_mlir import ir

from .base import Pass
from .collectives import UNSHARD, all_gather, nbytes, wait
from .registry import register
from .torch_ir import ATEN, VIEW_OPS, constant_bool, constant_int, constant_none, constant_value, create_aten, \
    functions, int_list_value, is_none, op_error, op_name, slice_tensor, tensor_info, vtensor_type


def _copy_variant(name: str) -> str:
    """``torch.aten.view`` -> ``torch.aten.view_copy``, ``slice.Tensor`` -> ``slice_copy.Tensor``."""
    op, dot, overload = name[len(ATEN):].partition(".")
    return ATEN + op + "_copy" + dot + overload


# Cheap ops a gathered parameter goes through before its real use (a linear
# layer's weight.t()): they are recomputed after each re-gather, so no value
# derived from the gathered tensor outlives its phase either.
DERIVING_OPS = {name for base in VIEW_OPS | {ATEN + "_to_copy", ATEN + "clone", ATEN + "contiguous"}
                for name in (base, _copy_variant(base))}


@register
@dataclasses.dataclass(frozen=True)
class ZeroInsertGather(Pass):
    """Replaces each ``torch.lazy_mlir.unshard(%shard, shape, N, group)``
    (the full parameter whose flat padded data is split over N ranks) by
    ``all_gather_into_tensor`` + ``wait_tensor`` + slice to the parameter's
    element count + ``view`` to its shape, placed just before its first use:
    nothing is gathered earlier than needed (zero-prefetch moves gathers
    earlier, within a budget). The uses count through ``DERIVING_OPS``
    (transposes, views, casts of the parameter): those are recomputed from
    the gathered tensor where needed.

    With ``regather`` (ZeRO-3), the uses split into phases: a new phase
    starts where other parameters of more than ``reuse-bytes`` in all were
    used since this one's previous use (typically: the forward use, then
    the backward uses). Each phase gathers anew, so no gathered parameter,
    nor any value derived from it, stays live across more than
    ``reuse-bytes`` of other parameters' uses; the code generator frees it
    after the phase's last use. ``reuse-bytes`` > 0 keeps e.g. the last
    layers gathered from their forward use to their backward use, as
    DeepSpeed's reuse distance does.

    A phase whose uses all read the parameter through one narrowing cast
    (``_to_copy`` to bfloat16 or float16: autocast's cast of a float32
    weight) gathers the shard cast instead, half the bytes (FSDP2's
    ``param_dtype``): a cast commutes with gathering, slicing and viewing,
    so the values are the same. The shard's cast is made once, where the
    shard is defined, so that zero-prefetch can still issue the gather early.
    Guarantees: no ``unshard`` marker remains; every gather's wait precedes
    all uses of its result."""

    name = "zero-insert-gather"
    regather: bool = True
    reuse_bytes: int = 0

    def apply(self, module) -> None:
        for func in functions(module):
            self._rewrite(func)

    def _rewrite(self, func) -> None:
        block = func.regions[0].blocks[0]
        index = {op.operation: i for i, op in enumerate(block.operations)}
        markers = [op.operation for op in block.operations if op_name(op) == UNSHARD]
        if not markers:
            return
        for marker in markers:  # the gather's size and the prefetch budget need static shapes
            info = tensor_info(marker.results[0])
            if info is None or info.shape is None or None in info.shape:
                raise op_error(ZeroInsertGather.name, marker, "group size and shape must be constants")
        # Plan everything before rewriting: an ir.Operation's hash changes when
        # its operands do, so the dicts keyed by ops are only good until then.
        uses = [_external_uses(marker, index) for marker in markers]
        timeline = sorted((index[u], k) for k, (_, external) in enumerate(uses) for u in external)
        sizes = [nbytes(marker.results[0]) for marker in markers]
        plans = [(marker, derived, self._phases(k, external, index, timeline, sizes))
                 for k, (marker, (derived, external)) in enumerate(zip(markers, uses))]
        for marker, derived, phases in plans:
            narrowed = {}  # dtype -> the shard cast to it (one cast for all phases)
            for phase in phases:
                _gather_for(marker, derived, phase, narrowed, block)
            for op in reversed(derived):
                op.erase()
            marker.erase()

    def _phases(self, k: int, external, index, timeline, sizes) -> list[list]:
        phases: list[list] = []
        previous = None
        for use in external:
            if previous is None or (self.regather and
                                    _others_between(timeline, sizes, k, previous, index[use], self.reuse_bytes)):
                phases.append([use])
            else:
                phases[-1].append(use)
            previous = index[use]
        return phases


def _external_uses(marker, index) -> tuple[list, list]:
    """(deriving ops fed by the marker, in program order; the other ops using
    the marker's result or a derived value, in program order, each once)."""
    derived_values = {marker.results[0]}
    derived, external = [], {}
    frontier = [marker.results[0]]
    seen = set()
    while frontier:
        value = frontier.pop()
        for use in value.uses:
            user = use.owner.operation
            if user in seen:
                continue
            if op_name(user) in DERIVING_OPS and _only_tensor_operand_is_derived(user, derived_values):
                seen.add(user)
                derived.append(user)
                derived_values.update(user.results)
                frontier.extend(user.results)
    derived.sort(key=index.__getitem__)
    for value in derived_values:
        for use in value.uses:
            if use.owner.operation not in seen:
                external[use.owner.operation] = None
    return derived, sorted(external, key=index.__getitem__)


def _only_tensor_operand_is_derived(op, derived_values) -> bool:
    tensors = [v for v in op.operands if tensor_info(v) is not None]
    return len(tensors) == 1 and tensors[0] in derived_values


def _others_between(timeline, sizes, k: int, start: int, end: int, budget: int) -> bool:
    """Whether other markers than the k-th, of more than ``budget`` bytes in
    all, are used strictly between positions start and end."""
    lo = bisect.bisect_right(timeline, (start, float("inf")))
    hi = bisect.bisect_left(timeline, (end, -1))
    others = {owner for _, owner in timeline[lo:hi] if owner != k}
    return bool(others) and sum(sizes[o] for o in others) > budget


def _gather_for(marker, derived: list, phase: list, narrowed: dict, block) -> None:
    """Gather before ``phase[0]``, recompute the derived values the phase
    uses, and point the phase's uses at them."""
    shard, shape_list, group_size, group_name = marker.operands
    world = constant_value(group_size)
    shape = int_list_value(shape_list)
    if not isinstance(world, int) or shape is None:
        raise op_error(ZeroInsertGather.name, marker, "group size and shape must be constants")
    first = phase[0]
    needed = _needed(derived, phase)
    full = marker.results[0]
    casts = _narrowing_casts(full, needed, phase)
    if casts:
        dtype = tensor_info(casts[0].results[0]).dtype
        if dtype not in narrowed:
            narrowed[dtype] = _cast_shard(shard, casts[0], block, first)
        shard = narrowed[dtype]
    gathered = all_gather(shard, group_size, group_name, world, first).results[0]
    value = wait(gathered, first).results[0]
    numel = math.prod(shape)
    if tensor_info(value).shape[0] != numel:  # drop the padding
        value = slice_tensor(value, 0, 0, numel, _with_shape(value, (numel,)), first)
    if list(tensor_info(full).shape) != [numel]:
        full_type = casts[0].results[0].type if casts else full.type
        value = create_aten("view", [value, shape_list], [full_type], first).results[0]
    mapping = {cast.results[0]: value for cast in casts} if casts else {full: value}
    for op in derived:
        if op in needed and op not in casts:
            clone = op.clone(ir.InsertionPoint(first))
            for i, operand in enumerate(op.operands):
                if operand in mapping:
                    clone.operands[i] = mapping[operand]
            mapping.update(zip(op.results, clone.results))
    for use in phase:
        for i, operand in enumerate(use.operands):
            if operand in mapping:
                use.operands[i] = mapping[operand]


_NARROWER = {"f32": ("bf16", "f16"), "f64": ("f32", "bf16", "f16")}


def _narrowing_casts(full, needed: set, phase: list) -> list:
    """The ``_to_copy`` ops to one narrower float type through which alone
    the phase reads the gathered parameter ``full``; [] if it reads it any
    other way too."""
    readers = [op for op in (*needed, *phase) if any(v == full for v in op.operands)]
    source = tensor_info(full).dtype
    if not readers or any(op in phase or not _dtype_only_cast(op) for op in readers):
        return []
    dtypes = {tensor_info(op.results[0]).dtype for op in readers}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _NARROWER.get(source, ()):
        return []
    return readers


def _dtype_only_cast(op) -> bool:
    """``_to_copy(x, dtype)`` with layout, device, pin_memory and
    memory_format unset and non_blocking false (autocast's cast): what
    ``_cast_shard`` rebuilds for the shard."""
    if op_name(op) != ATEN + "_to_copy":
        return False
    _, _, layout, device, pin_memory, non_blocking, memory_format = op.operands
    return all(map(is_none, (layout, device, pin_memory, memory_format))) and constant_value(non_blocking) is False


def _cast_shard(shard: ir.Value, cast, block, first) -> ir.Value:
    """``shard`` cast as ``cast`` casts the full parameter, placed right where
    the shard is defined (the function's start for an argument)."""
    dtype_code = constant_value(cast.operands[1])
    if not isinstance(dtype_code, int):
        raise op_error(ZeroInsertGather.name, cast, "a narrowing cast needs a constant dtype")
    dtype = tensor_info(cast.results[0]).dtype
    none = constant_none(first)
    operands = [shard, constant_int(dtype_code, first), none, none, none, constant_bool(False, first), none]
    new_ops = [operands[1].owner.operation, none.owner.operation, operands[5].owner.operation]
    new_ops.append(create_aten("_to_copy", operands, [_with_shape(shard, tensor_info(shard).shape, dtype)], first))
    if isinstance(shard.owner, ir.Block):
        anchor = block.operations[0].operation
        for op in new_ops:
            op.move_before(anchor)
    else:
        anchor = shard.owner.operation
        for op in reversed(new_ops):
            op.move_after(anchor)
    return new_ops[-1].results[0]


def _needed(derived: list, phase: list) -> set:
    """The deriving ops whose results the phase's uses need, transitively."""
    producer = {result: op for op in derived for result in op.results}
    needed, pending = set(), [v for use in phase for v in use.operands if v in producer]
    while pending:
        op = producer[pending.pop()]
        if op not in needed:
            needed.add(op)
            pending.extend(v for v in op.operands if v in producer)
    return needed


def _with_shape(value: ir.Value, shape, dtype: str | None = None) -> ir.Type:
    return vtensor_type(shape, dtype or tensor_info(value).dtype, value.type.context)
