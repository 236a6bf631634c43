"""Functionalized copy variants of view ops -> the view ops themselves."""
from __future__ import annotations

import dataclasses
import re

from torch_mlir import ir

from .base import Pass
from .registry import register
from .torch_ir import (aten_name, constant_value, create_aten, functions, op_error, op_name, ops_of, replace_op,
                       tensor_info)

# Copy variant -> view op taking the same operands (checked against the
# torch.ops.aten schemas by tests/mlir/test_aten_schemas.py).
VIEW_OF_COPY = {
    "t_copy": "t",
    # reshape, not view: aten.view needs viewable strides when Inductor
    # leaves it to an eager fallback; on value semantics both mean the same.
    "view_copy": "reshape",
    "_unsafe_view": "reshape",
    "view_copy.dtype": "view.dtype",
    "permute_copy": "permute",
    "transpose_copy.int": "transpose.int",
    "expand_copy": "expand",
    "select_copy.int": "select.int",
    "slice_copy.Tensor": "slice.Tensor",
    "diagonal_copy": "diagonal",
    "unsqueeze_copy": "unsqueeze",
    "squeeze_copy": "squeeze",
    "squeeze_copy.dim": "squeeze.dim",
    "squeeze_copy.dims": "squeeze.dims",
    "split_copy.Tensor": "split.Tensor",
    "split_with_sizes_copy": "split_with_sizes",
    "unbind_copy.int": "unbind.int",
}
# Ops whose result equals their operand on value semantics.
IDENTITIES = {"detach_copy", "alias_copy", "detach", "alias"}

# --- What may be written: the ops that break value semantics ---------------
# Recognized by name (this module imports no torch); that every ATen and
# prims overload whose schema writes a tensor (``Tensor(a!)``) is recognized
# is checked against torch's schemas by tests/mlir/test_fold_copy_ops_aliasing.py.
# In-place dunders (the other dunders, ``__and__``, ``__getitem__``, ``__is__``, do not write).
INPLACE_DUNDERS = frozenset({"__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})
# out= overloads: add.out, _foreach_add.List_out, range.out_, div.out_mode, xlogy.OutTensor.
_OUT_OVERLOAD = re.compile(r"(\w*_)?out(_\w*)?|Out\w*")
# out= overloads named after their out argument: max.dim_max, sort.values, tanh_backward.grad_input, svd.U, ...
OUT_ARGUMENT_OVERLOADS = frozenset({"grad_input", "output", "result", "values", "values_stable", "dim_values",
                                    "dim_max", "dim_min", "inverse", "sign", "eigvals", "eigenvalues",
                                    "U", "L", "Q", "X"})
# "ns.op" (all overloads) or "ns.op.overload" writing an operand under a functional name.
WRITING_OPS = frozenset({
    "aten._native_batch_norm_legit", "aten._batch_norm_with_update", "aten.rrelu_with_noise",
    "aten.fused_moving_avg_obs_fake_quant", "aten._fused_moving_avg_obs_fq_helper", "aten._cummax_helper",
    "aten._cummin_helper", "aten._flash_attention_forward_no_dropout_inplace", "aten.record_stream",
    "aten.set_data", "aten.retain_grad", "aten.geqrf.a", "prims.copy_to", "prims.resize", "prims.as_strided",
    # TorchScript's list and dict mutations (they write a container, not a tensor's buffer)
    "aten.append", "aten.insert", "aten.extend", "aten._set_item", "aten.pop", "aten.popitem", "aten.remove",
    "aten.clear", "aten.reverse", "aten.setdefault", "aten.update", "aten.Delete", "aten.sort.Tensor", "aten.sort.any",
})
# Ops whose schema declares no write but which update the running statistics
# (operands 3, 4) in training (operand 5): writing unless that is a constant false.
RUNNING_STATS_OPS = frozenset({"aten.native_batch_norm", "aten.batch_norm", "aten._batch_norm_impl_index",
                               "aten.cudnn_batch_norm", "aten.miopen_batch_norm", "aten.instance_norm"})
TRAINING_OPERAND = 5
# torch-mlir's ops between value and reference semantics (and a call, whose
# callee may write its arguments: it is checked on its own, its writes not seen here).
NON_VALUE_OPS = frozenset({"torch.copy.to_tensor", "torch.copy.to_vtensor", "torch.overwrite.tensor.contents",
                           "func.call", "func.call_indirect"})

# --- What may alias: ops whose result may share an operand's buffer --------
# ATen ops ("op": all overloads, or "op.overload") whose schema makes a result alias an input
# (``Tensor(a) self -> Tensor(a)``), those that do so without saying it
# (_unsafe_view, unsafe_split, type_as: may return self), and TorchScript's
# list/dict accessors. Non-ATen ops (torch.prim.ListConstruct, TupleUnpack,
# tensor_static_info_cast, derefine, prims.view_of, prim.If/Loop and their
# yields, other namespaces) all count as aliasing their tensor operands.
VIEW_LIKE = frozenset({
    "_autocast_to_full_precision", "_autocast_to_reduced_precision", "_conj", "_fw_primal", "_grad_sum_to_size",
    "_indices", "_make_dual", "_ncf_unsqueeze", "_ncf_view", "_neg_view", "_nested_get_values",
    "_nested_view_from_buffer", "_nested_view_from_jagged", "_reshape_alias", "_sparse_broadcast_to",
    "_test_autograd_multiple_dispatch_view", "_unpack_dual", "_unsafe_view", "_unwrap_optional", "_values", "adjoint",
    "alias", "as_strided", "as_tensor", "broadcast_to", "ccol_indices", "chunk", "coalesce", "col_indices", "conj",
    "contiguous", "cpu", "crow_indices", "cuda", "detach", "diagonal", "dsplit", "expand", "expand_as", "flatten",
    "hsplit", "imag", "indices", "lift_fresh", "linalg_diagonal", "mH", "mT", "matrix_H", "moveaxis", "movedim",
    "narrow", "numpy_T", "permute", "pin_memory", "positive", "ravel", "real", "reshape", "reshape_as",
    "resolve_conj", "resolve_neg", "row_indices", "select", "slice", "slice_inverse", "split", "split_with_sizes",
    "squeeze", "swapaxes", "swapdims", "t", "tensor_split", "to", "transpose", "type_as", "unbind", "unflatten",
    "unfold", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "unsqueeze", "values", "view", "view_as",
    "view_as_complex", "view_as_real", "vsplit",
    # TorchScript containers
    "__getitem__", "dict", "get", "keys", "local_value", "sorted", "to_here", "copy.t", "copy.Dict_str",
    "copy.Dict_int", "copy.Dict_bool", "copy.Dict_float", "copy.Dict_complex", "copy.Dict_Tensor",
})
# The ops this pass folds become views or their operand: they join classes too.
_FOLDED = frozenset(name.split(".")[0] for name in [*VIEW_OF_COPY, *IDENTITIES])
_REFERENCE_TYPE = re.compile(r"(?<!\w)tensor\b")  # !torch.tensor, !torch.list<tensor>; not vtensor


def split_name(full_name: str) -> tuple[str, str, str] | None:
    """``"torch.aten.add_.Tensor"`` -> ("aten", "add_", "Tensor"); None for a
    name that is not ``torch.<namespace>.<op>[.<overload>]``."""
    parts = full_name.split(".", 3)
    if len(parts) < 3 or parts[0] != "torch":
        return None
    return parts[1], parts[2], parts[3] if len(parts) > 3 else ""


def writes_by_name(namespace: str, base: str, overload: str) -> bool:
    """Whether op ``namespace::base.overload`` may write a tensor operand, by
    its name: in-place (``add_``, ``_foreach_add_``, ``__iand__``), out=
    (``add.out``, ``max.dim_max``, ``all_gather_into_tensor_out``) or listed."""
    dunder = base.startswith("__") and base.endswith("__")
    return ((base.endswith("_") and not dunder) or base in INPLACE_DUNDERS or base.endswith("_out")
            or bool(_OUT_OVERLOAD.fullmatch(overload)) or overload in OUT_ARGUMENT_OVERLOADS
            or f"{namespace}.{base}" in WRITING_OPS or f"{namespace}.{base}.{overload}" in WRITING_OPS)


def _carries_tensor(value: ir.Value) -> bool:
    return "tensor" in str(value.type)


def _is_reference(value: ir.Value) -> bool:
    text = str(value.type)
    return text.startswith("!torch.") and bool(_REFERENCE_TYPE.search(text))


class _Classes:
    """Union-find of values that may share a buffer, each class marked if any
    of its values may be written."""

    def __init__(self):
        self.parent: dict = {}
        self.written: set = set()

    def find(self, value):
        self.parent.setdefault(value, value)
        root = value
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[value] != root:
            self.parent[value], value = root, self.parent[value]
        return root

    def union(self, values) -> None:
        roots = [self.find(v) for v in values]
        for root in roots[1:]:
            if root != roots[0]:
                self.parent[root] = roots[0]
                if root in self.written:
                    self.written.add(roots[0])

    def mark(self, value) -> None:
        self.written.add(self.find(value))

    def is_written(self, value) -> bool:
        return self.find(value) in self.written


def _writes(op, full_name: str) -> bool:
    if full_name in NON_VALUE_OPS:
        return True
    parts = split_name(full_name)
    if parts is None:
        return False
    namespace, base, _ = parts
    if f"{namespace}.{base}" in RUNNING_STATS_OPS:
        operands = op.operation.operands
        return len(operands) <= TRAINING_OPERAND or constant_value(operands[TRAINING_OPERAND]) is not False
    return writes_by_name(*parts)


def may_alias(full_name: str) -> bool:
    """Whether op ``full_name`` (``"torch.aten.t"``) may give a result sharing a tensor operand's buffer."""
    parts = split_name(full_name)
    if parts is None or parts[0] != "aten":
        return not full_name.startswith("torch.constant.") and full_name not in ("func.func", "func.return")
    _, base, overload = parts
    return base in VIEW_LIKE or f"{base}.{overload}" in VIEW_LIKE or base in _FOLDED


def alias_classes(func) -> _Classes:
    """The alias classes of ``func``'s tensor values, each marked if it may be
    written (see FoldCopyOps)."""
    classes = _Classes()
    # Inputs may share a buffer (LTC passes one tensor at two positions).
    inputs = [a for a in func.regions[0].blocks[0].arguments if _carries_tensor(a)]
    classes.union(inputs)
    for value in inputs:
        if _is_reference(value):
            classes.mark(value)
    for op in ops_of(func):
        full_name = op_name(op)
        if full_name == "func.func":
            continue
        values = [*op.operation.operands, *op.operation.results]
        for region in op.operation.regions:  # prim.If/Loop: results, block arguments, yields
            for block in region.blocks:
                values += block.arguments
                if len(block.operations):
                    values += block.operations[len(block.operations) - 1].operands
        values = [v for v in values if _carries_tensor(v)]
        for value in values:
            if _is_reference(value):
                classes.mark(value)
        if _writes(op, full_name):
            for value in values:
                classes.mark(value)
        elif may_alias(full_name):
            classes.union(values)
    return classes


@register
@dataclasses.dataclass(frozen=True)
class FoldCopyOps(Pass):
    """Replaces the ``*_copy`` ops of functionalized graphs (LTC, AOT) by
    their view forms (``t_copy`` -> ``t``, ``view_copy`` -> ``reshape``, ...,
    see VIEW_OF_COPY), with the same operands and result types, and deletes
    ``detach_copy``/``alias_copy``/``detach``/``alias``, using their operand
    instead (left alone if the types differ).

    Precondition, per function: a view and a copy are indistinguishable
    only if neither is written, and Inductor really makes a view share its
    base's buffer (a write to the base, the view or a view of either is
    seen on the other side). So (1) every op it rewrites has only
    ``!torch.vtensor`` operands and results, else it raises, naming the op;
    (2) no value in the op's alias class may be written, else the op is left
    as it is (not an error). Alias class: the values joined by ops that may
    return a view (VIEW_LIKE ATen ops, the ops this pass rewrites, every
    non-ATen op: lists, tuples, casts, prim.If/Loop with their block
    arguments and yields), and all the function's tensor inputs (LTC may
    pass one tensor at two positions). May be written: every tensor operand
    and result of an in-place op (``X_`` but not a dunder, ``__iand__``...),
    an out= overload (``.out``, ``.dim_max``, ``.grad_input``...), a
    WRITING_OPS op, a batch norm unless ``training`` is a constant false,
    ``torch.overwrite.tensor.contents``, ``torch.copy.to_tensor`` or
    ``to_vtensor``, ``func.call``, in typed or ``torch.operator`` form; and
    every value of reference type (``!torch.tensor``). Classes are made as if
    every op were rewritten, so an op kept does not let another through.

    Guarantees: every op it emits is an ATen overload with its schema's
    operands (so Inductor can take views, not full copies); results and
    their types are unchanged; no buffer a view it creates shares is written
    by an op of the function. Writes added to the graph later (donation's
    ``copy_`` into inputs) are out of its sight: donation itself refuses an
    input that an output aliases."""

    name = "fold-copy-ops"

    def apply(self, module) -> None:
        for func in functions(module):
            folded = [op for op in ops_of(func) if aten_name(op) in VIEW_OF_COPY or aten_name(op) in IDENTITIES]
            for op in folded:
                self._check_value_semantics(op)
            if not folded:
                continue
            # decided on the function as it is, before any rewrite
            classes = alias_classes(func)
            for op in [op for op in folded if not classes.is_written(op.operation.operands[0])]:
                self._fold(op)

    @staticmethod
    def _fold(op) -> None:
        name = aten_name(op)
        if name in IDENTITIES:
            source = op.operation.operands[0]
            if source.type == op.operation.results[0].type:
                replace_op(op, [source])
            return
        results = op.operation.results
        view = create_aten(VIEW_OF_COPY[name], list(op.operation.operands), [r.type for r in results], op)
        replace_op(op, view.results)

    def _check_value_semantics(self, op) -> None:
        for value in [*op.operation.operands, *op.operation.results]:
            info = tensor_info(value)
            if info is not None and not info.value_semantics:
                raise op_error(self.name, op, f"expects value semantics (!torch.vtensor) but has {value.type}; "
                                              "run it on functional IR as FxImporter produces")
