"""Moves each gradient's reduction, and the ops only it needs, up to where its inputs are ready."""
from __future__ import annotations

import dataclasses

from torch_mlir import ir

from .base import Pass
from .collectives import REDUCE_GRAD
from .registry import register
from .torch_ir import functions, hoist_constants, op_name

# Ops whose relative order carries meaning beyond their operands: random
# number draws consume one generator in program order.
_ORDERED = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "randperm")


@register
@dataclasses.dataclass(frozen=True)
class ZeroHoistReduces(Pass):
    """LTC lowers a step in post-order from its outputs, so a gradient's
    last ops (a weight gradient's ``mm``) and its ``reduce_grad`` marker sit
    just before the optimizer update that uses them, after all of backward:
    no reduction could overlap backward's compute.

    For each ``torch.lazy_mlir.reduce_grad`` marker, in block order, this
    pass takes its private cone (the ops whose results only the marker
    needs, directly or not) and moves the cone and the marker, in their
    order, to just after the latest op that defines a value the cone takes
    from elsewhere (the block's start when there is none). Constants move to
    the block's start first, so a shared one never holds a cone back.
    Markers that land at one point keep their order. Run before
    ``zero-reduce-grads``, whose collective then starts right after the
    gradient is made.

    Only value-semantics ``torch.aten``/``torch.prim``/``torch.constant``
    ops move; ops with regions, non-value tensors or random draws stay.
    Guarantees: every op still follows the definitions of its operands; the
    markers keep their relative order."""

    name = "zero-hoist-reduces"

    def apply(self, module) -> None:
        for func in functions(module):
            block = func.regions[0].blocks[0]
            hoist_constants(block)  # shared constants must not hold a cone back
            markers = [op.operation for op in block.operations if op_name(op) == REDUCE_GRAD]
            landed: list[tuple[object, object]] = []  # (anchor, last op moved there)
            for marker in markers:
                self._hoist(block, marker, landed)

    def _hoist(self, block, marker, landed) -> None:
        # ops key the dicts below: moving ops keeps their hashes (changing operands would not)
        ops = [op.operation for op in block.operations]
        index = {op: i for i, op in enumerate(ops)}
        at = index[marker]
        cone = {marker}
        for op in reversed(ops[:at]):  # users come after their definitions: decided first
            if _movable(op) and _results_used_only_by(op, cone) and any(True for r in op.results for _ in r.uses):
                cone.add(op)
        members = [op for op in ops[:at + 1] if op in cone]
        anchor_index = -1
        for op in members:
            for value in op.operands:
                owner = value.owner
                if not isinstance(owner, ir.Block) and owner.operation not in cone:
                    anchor_index = max(anchor_index, index[owner.operation])
        anchor = ops[anchor_index] if anchor_index >= 0 else None
        after = next((last for a, last in landed if _same(a, anchor)), anchor)
        after_index = index[after] if after is not None else -1
        moving = [op for op in members if index[op] > anchor_index]
        if all(index[op] == after_index + 1 + k for k, op in enumerate(moving)):
            landed[:] = [(a, last) for a, last in landed if not _same(a, anchor)] + [(anchor, marker)]
            return  # already there
        for op in moving:
            if after is None:
                first = block.operations[0].operation
                if op != first:
                    op.move_before(first)
            else:
                op.move_after(after)
            after = op
        landed[:] = [(a, last) for a, last in landed if not _same(a, anchor)] + [(anchor, after)]


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a == b)


def _movable(op) -> bool:
    name = op_name(op)
    if not name.startswith(("torch.aten.", "torch.prim.", "torch.constant.")) or any(s in name for s in _ORDERED):
        return False
    if len(op.regions):
        return False
    types = [v.type for v in op.operands] + [r.type for r in op.results]
    return not any(str(t).startswith("!torch.tensor") for t in types)


def _results_used_only_by(op, cone: set[int]) -> bool:
    return all(use.owner.operation in cone for result in op.results for use in result.uses)
