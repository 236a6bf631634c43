"""Reading and building torch-dialect IR through the MLIR Python bindings.

Everything built here stays a 1:1 image of ATen: ``torch.aten.X.ovl`` with the
operands of ``torch.ops.aten.X.ovl``'s schema, in order, so the module can be
exported back to torch.fx.
"""
from __future__ import annotations

import dataclasses
import re

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from .base import PassError

ATEN = "torch.aten."
# ops whose result shares its tensor operand's buffer
VIEW_OPS = {ATEN + name for name in ("t", "transpose.int", "permute", "view", "reshape", "_unsafe_view", "expand",
                                     "unsqueeze", "squeeze.dim", "slice.Tensor", "select.int", "alias", "detach")}
_TENSOR_TYPE = re.compile(r"!torch\.(v?tensor)(?:<(\*|\[[^\]]*\]),(.+)>)?")


def ops_of(module) -> list:
    """Every op nested in ``module`` (an ``ir.Module`` or an op), in program
    order; a snapshot, so the caller may rewrite while iterating."""
    ops = []

    def collect(op):
        ops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return ops


def aten_name(op) -> str | None:
    """``"t_copy"``, ``"transpose_copy.int"``, ... for an ATen op, registered in
    torch-mlir or imported generically (``torch.operator "torch.aten.X.ovl"``)."""
    name = op.operation.name
    if name == "torch.operator":
        name = ir.StringAttr(op.operation.attributes["name"]).value
    return name[len(ATEN):] if name.startswith(ATEN) else None


def defining_op_name(value: ir.Value) -> str | None:
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation.name


def is_constant(value: ir.Value, number: float) -> bool:
    """Whether ``value`` is a ``torch.constant.int``/``.float`` equal to ``number``."""
    kind = defining_op_name(value)
    if kind not in ("torch.constant.int", "torch.constant.float"):
        return False
    attr = value.owner.operation.attributes["value"]
    return (ir.IntegerAttr(attr) if kind == "torch.constant.int" else ir.FloatAttr(attr)).value == number


def is_none(value: ir.Value) -> bool:
    return defining_op_name(value) == "torch.constant.none"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """What a torch tensor type says: ``!torch.vtensor<[4,?],f32>`` has
    shape (4, None) and dtype "f32"; unknown rank or dtype is None."""

    value_semantics: bool
    shape: tuple[int | None, ...] | None
    dtype: str | None

    @property
    def category(self) -> str | None:
        """"float", "int" or "bool" (the classes of PyTorch's type promotion)."""
        if self.dtype is None:
            return None
        if self.dtype == "i1":
            return "bool"
        if re.fullmatch(r"[su]i\d+", self.dtype):
            return "int"
        if re.fullmatch(r"b?f\d+\w*", self.dtype):
            return "float"
        return None


def tensor_info(value: ir.Value) -> TensorInfo | None:
    """The tensor type of ``value`` parsed from its text; None if not a tensor."""
    match = _TENSOR_TYPE.fullmatch(str(value.type))
    if not match:
        return None
    kind, shape, dtype = match.groups()
    dims = None
    if shape not in (None, "*"):
        dims = tuple(None if d == "?" else int(d) for d in shape[1:-1].split(",") if d)
    return TensorInfo(kind == "vtensor", dims, dtype if dtype not in (None, "unk") else None)


def vtensor_type(shape, dtype: str, context) -> ir.Type:
    dims = ",".join("?" if d is None else str(d) for d in shape)
    return ir.Type.parse(f"!torch.vtensor<[{dims}],{dtype}>", context)


def broadcast_shapes(a, b) -> tuple[int, ...] | None:
    """PyTorch broadcasting of two static shapes; None if unknown or invalid."""
    if a is None or b is None or None in a or None in b:
        return None
    rank = max(len(a), len(b))
    result = []
    for x, y in zip((1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)):
        if x != y and 1 not in (x, y):
            return None
        result.append(y if x == 1 else x)
    return tuple(result)


def op_name(op) -> str:
    """The op's full name; for ``torch.operator`` the name of the operator
    (``"torch._c10d_functional.wait_tensor"``)."""
    name = op.operation.name
    return ir.StringAttr(op.operation.attributes["name"]).value if name == "torch.operator" else name


def create_aten(name: str, operands, result_types, before) -> ir.Operation:
    """Insert ``torch.aten.<name>`` just before op ``before``, at its location."""
    return create_op(ATEN + name, operands, result_types, before)


def create_op(full_name: str, operands, result_types, before) -> ir.Operation:
    """Insert op ``full_name`` (``torch.aten.mm``, ``torch._c10d_functional.wait_tensor``)
    just before op ``before``, at its location: as the registered torch-mlir
    op, or as ``torch.operator`` where torch-mlir has none (the form
    FxImporter gives such ops)."""
    loc = before.location
    with ir.InsertionPoint(before):
        if loc.context.is_registered_operation(full_name):
            return ir.Operation.create(full_name, results=result_types, operands=operands, loc=loc)
        return ir.Operation.create("torch.operator", results=result_types, operands=operands, loc=loc,
                                   attributes={"name": ir.StringAttr.get(full_name, loc.context)})


def constant_int(value: int, before) -> ir.Value:
    return torch_d.ConstantIntOp(value, loc=before.location, ip=ir.InsertionPoint(before)).result


def constant_float(value: float, before) -> ir.Value:
    return torch_d.ConstantFloatOp(ir.FloatAttr.get_f64(value), loc=before.location,
                                   ip=ir.InsertionPoint(before)).result


def constant_str(value: str, before) -> ir.Value:
    return torch_d.ConstantStrOp(value, loc=before.location, ip=ir.InsertionPoint(before)).result


def constant_bool(value: bool, before) -> ir.Value:
    return torch_d.ConstantBoolOp(value, loc=before.location, ip=ir.InsertionPoint(before)).result


def constant_none(before) -> ir.Value:
    return torch_d.ConstantNoneOp(loc=before.location, ip=ir.InsertionPoint(before)).result


def int_list(values, before) -> ir.Value:
    """``torch.prim.ListConstruct`` of int constants."""
    items = [constant_int(v, before) for v in values]
    list_type = ir.Type.parse("!torch.list<int>", before.location.context)
    return torch_d.PrimListConstructOp(list_type, items, loc=before.location, ip=ir.InsertionPoint(before)).result


def slice_tensor(value: ir.Value, dim: int, start: int, end: int, result_type, before) -> ir.Value:
    """``value[start:end]`` along ``dim`` (step 1)."""
    args = [value] + [constant_int(v, before) for v in (dim, start, end, 1)]
    return create_aten("slice.Tensor", args, [result_type], before).results[0]


def cat(values, dim: int, result_type, before) -> ir.Value:
    with ir.InsertionPoint(before), before.location:
        tensors = torch_d.PrimListConstructOp(ir.Type.parse("!torch.list<vtensor>", before.context), values).result
    return create_aten("cat", [tensors, constant_int(dim, before)], [result_type], before).results[0]


def constant_value(value: ir.Value):
    """The Python value of a ``torch.constant.int/float/str/bool``; None otherwise."""
    kind = defining_op_name(value)
    attrs = value.owner.operation.attributes if kind else None
    if kind == "torch.constant.int":
        return ir.IntegerAttr(attrs["value"]).value
    if kind == "torch.constant.float":
        return ir.FloatAttr(attrs["value"]).value
    if kind == "torch.constant.str":
        return ir.StringAttr(attrs["value"]).value
    if kind == "torch.constant.bool":
        return ir.BoolAttr(attrs["value"]).value
    return None


def int_list_value(value: ir.Value) -> list[int] | None:
    """The ints of a ``torch.prim.ListConstruct`` of int constants; None otherwise."""
    if defining_op_name(value) != "torch.prim.ListConstruct":
        return None
    items = [constant_value(v) for v in value.owner.operation.operands]
    return items if all(isinstance(i, int) for i in items) else None


def functions(module) -> list:
    return [op.operation.opview for op in ops_of(module) if op.operation.name == "func.func"]


def hoist_constants(block) -> None:
    """Move every ``torch.constant.*`` op of ``block`` to its start, in order:
    a pass that moves ops earlier is then bound by their real operands
    only, not by where a shared constant happened to be printed."""
    constants = [op.operation for op in block.operations if op.operation.name.startswith("torch.constant.")]
    previous = None
    for constant in constants:
        if previous is not None:
            constant.move_after(previous)
        elif constant != block.operations[0].operation:
            constant.move_before(block.operations[0].operation)
        previous = constant


def replace_op(op, new_values) -> None:
    for old, new in zip(op.operation.results, new_values, strict=True):
        old.replace_all_uses_with(new)
    op.operation.erase()


def describe(op) -> str:
    """``'torch.aten.t_copy' at "model.py":12:3``, for error messages."""
    name = aten_name(op)
    text = f"'{ATEN + name if name else op.operation.name}'"
    loc = str(op.location)
    return text if loc == "loc(unknown)" else f"{text} at {loc.removeprefix('loc(').removesuffix(')')}"


def op_error(pass_name: str, op, why: str) -> PassError:
    return PassError(f"{pass_name}: {describe(op)}: {why}")
