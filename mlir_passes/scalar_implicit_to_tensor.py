"""Runtime scalars (``aten.ScalarImplicit`` of a 0-d tensor) -> tensor operands."""
from __future__ import annotations

import dataclasses

from torch_mlir import ir

from .base import Pass
from .registry import register
from .torch_ir import (aten_name, broadcast_shapes, constant_int, create_aten, defining_op_name,
                       is_constant, is_none, ops_of, replace_op, tensor_info, vtensor_type)

SCALAR_IMPLICIT = "torch.aten.ScalarImplicit"


@dataclasses.dataclass(frozen=True)
class TensorOverload:
    """The overload taking, at the same operand positions, 0-d tensors instead of scalars."""

    target: str
    scalars: tuple[int, ...]  # positions of the Scalar operands
    like: int = 0  # the tensor operand whose dtype the result keeps
    same_dtype: bool = False  # the target needs the 0-d tensor in exactly that dtype


TENSOR_OVERLOADS = {
    **{f"{op}.Scalar": TensorOverload(f"{op}.Tensor", (1,))
       for op in ("add", "sub", "mul", "div", "remainder", "fmod", "eq", "ne", "lt", "le", "gt", "ge")},
    "div.Scalar_mode": TensorOverload("div.Tensor_mode", (1,)),
    "pow.Tensor_Scalar": TensorOverload("pow.Tensor_Tensor", (1,)),
    "fill.Scalar": TensorOverload("fill.Tensor", (1,)),
    "masked_fill.Scalar": TensorOverload("masked_fill.Tensor", (2,)),
    "clamp": TensorOverload("clamp.Tensor", (1, 2)),
    "clamp_min": TensorOverload("clamp_min.Tensor", (1,)),
    "clamp_max": TensorOverload("clamp_max.Tensor", (1,)),
    "lerp.Scalar": TensorOverload("lerp.Tensor", (2,), same_dtype=True),
    "where.ScalarOther": TensorOverload("where.self", (2,), like=1),
    "where.ScalarSelf": TensorOverload("where.self", (1,), like=2),
}


@register
@dataclasses.dataclass(frozen=True)
class ScalarImplicitToTensor(Pass):
    """LTC passes Python scalars (lr, alpha, eps, weight decay) as 0-d tensors
    read through ``aten.ScalarImplicit``; Inductor cannot take such a runtime
    scalar, and specialising its value would recompile whenever it changes.
    This pass rewrites the consumers into tensor arithmetic on the 0-d tensor:
    ``X.Scalar`` -> ``X.Tensor`` overloads (TENSOR_OVERLOADS, ``rsub.Scalar``
    -> ``sub.Tensor``), an ``alpha`` of ``add/sub.Tensor`` -> ``mul``, the
    ``value`` of ``addcmul/addcdiv`` and ``beta/alpha`` of ``addmm`` ->
    ``mul``/``div``/``mm``/``add`` in eager's order of evaluation, then
    erases the ScalarImplicit ops left unused. It rewrites an op only where
    PyTorch's type promotion gives the same dtype: the 0-d tensor must be of
    the int/float category of the tensor it meets and, if that one is 0-d
    too, of its exact dtype. Anything else (unknown consumers, scalar
    arithmetic, mixed categories) is left as is, and the compiler keeps that
    group out of Inductor. Guarantees unchanged result types and only ATen
    overloads with their schema's operands. Values may differ from eager in
    the last bit: each new op rounds, where eager fuses ``a + alpha * b`` (an
    FMA on CPU) and keeps float16/bfloat16 intermediates in float32."""

    name = "scalar-implicit-to-tensor"

    def apply(self, module) -> None:
        # Repeat until stable: add.Scalar with a runtime alpha becomes
        # add.Tensor with a runtime alpha. Each rewrite drops a ScalarImplicit use.
        while sum(self._rewrite(op) for op in ops_of(module)):
            pass
        for op in ops_of(module):
            if op.operation.name == SCALAR_IMPLICIT and next(iter(op.result.uses), None) is None:
                op.operation.erase()

    def _rewrite(self, op) -> bool:
        name = aten_name(op)
        if name in TENSOR_OVERLOADS:
            return _use_tensor_overload(op, TENSOR_OVERLOADS[name])
        rewrite = REWRITES.get(name)
        return rewrite is not None and rewrite(op)


def _scalar_tensor(value: ir.Value) -> ir.Value | None:
    """The 0-d tensor a ScalarImplicit ``value`` reads, if it is one."""
    if defining_op_name(value) != SCALAR_IMPLICIT:
        return None
    tensor = value.owner.operation.operands[0]
    info = tensor_info(tensor)
    return tensor if info is not None and info.value_semantics and info.shape == () else None


_RANK = {"bool": 0, "int": 1, "float": 2}  # PyTorch's promotion categories


def _acts_as_scalar(tensor: ir.Value, beside: ir.Value, same_dtype: bool = False) -> bool:
    """Whether 0-d ``tensor`` in place of a Python scalar, next to tensor
    ``beside``, leaves the result dtype unchanged."""
    t, b = tensor_info(tensor), tensor_info(beside)
    if b is None or t.category is None or b.category is None:
        return False
    if t.dtype == b.dtype:
        return True
    if same_dtype:
        return False
    # Next to a dimensioned tensor, a 0-d one of the same or a lower category
    # (LTC passes alpha=1 as an int64 0-d tensor) keeps the result dtype; two
    # 0-d tensors promote by dtype, so only a lower category keeps it.
    if b.shape is not None and len(b.shape) > 0:
        return _RANK[t.category] <= _RANK[b.category]
    return _RANK[t.category] < _RANK[b.category]


def _use_tensor_overload(op, overload: TensorOverload) -> bool:
    operands = list(op.operation.operands)
    scalars = [operands[i] for i in overload.scalars]
    tensors = [_scalar_tensor(s) for s in scalars]
    # Each Scalar operand is a runtime scalar acting as a Python one, or None.
    if all(t is None for t in tensors):
        return False
    for scalar, tensor in zip(scalars, tensors):
        if not (is_none(scalar) if tensor is None else
                _acts_as_scalar(tensor, operands[overload.like], overload.same_dtype)):
            return False
    for i, tensor in zip(overload.scalars, tensors):
        if tensor is not None:
            operands[i] = tensor
    _replace(op, overload.target, operands)
    return True


def _rsub(op) -> bool:
    # rsub(self, other, alpha) = other - alpha * self
    self_, other, alpha = op.operation.operands
    tensor = _scalar_tensor(other)
    if tensor is None or not _acts_as_scalar(tensor, self_):
        return False
    _replace(op, "sub.Tensor", [tensor, self_, alpha])
    return True


def _alpha(op) -> bool:
    # add/sub.Tensor(a, b, alpha) = a +/- alpha * b
    a, b, alpha = op.operation.operands
    tensor = _scalar_tensor(alpha)
    if tensor is None or not _acts_as_scalar(tensor, b):
        return False
    scaled = _emit("mul.Tensor", [b, tensor], b.type, op)
    _replace(op, aten_name(op), [a, scaled, constant_int(1, op)])
    return True


def _addc(op) -> bool:
    # addcmul/addcdiv(x, t1, t2, value) = x + (value * t1) *|/ t2, in eager's order
    x, t1, t2, value = op.operation.operands
    tensor = _scalar_tensor(value)
    x_info, t1_info, t2_info = tensor_info(x), tensor_info(t1), tensor_info(t2)
    shape = broadcast_shapes(t1_info.shape, t2_info.shape)
    if tensor is None or shape is None or not x_info.dtype == t1_info.dtype == t2_info.dtype \
            or not _acts_as_scalar(tensor, t1):
        return False
    scaled = _emit("mul.Tensor", [t1, tensor], t1.type, op)
    combine = "mul.Tensor" if aten_name(op) == "addcmul" else "div.Tensor"
    combined = _emit(combine, [scaled, t2], vtensor_type(shape, t1_info.dtype, op.context), op)
    _replace(op, "add.Tensor", [x, combined, constant_int(1, op)])
    return True


def _addmm(op) -> bool:
    # addmm(bias, m1, m2, beta, alpha) = beta * bias + alpha * (m1 @ m2)
    bias, m1, m2, beta, alpha = op.operation.operands
    m1_info, m2_info = tensor_info(m1), tensor_info(m2)
    if (m1_info.shape is None or m2_info.shape is None or len(m1_info.shape) != 2 or len(m2_info.shape) != 2
            or not tensor_info(bias).dtype == m1_info.dtype == m2_info.dtype):
        return False
    beta_tensor, alpha_tensor = _scalar_tensor(beta), _scalar_tensor(alpha)
    if beta_tensor is None and alpha_tensor is None:
        return False
    # Each factor is a runtime scalar acting as a Python one, or the constant 1
    # (no mul). The product has m1's dtype and rank: m1 stands for it.
    for scalar, tensor, beside in ((beta, beta_tensor, bias), (alpha, alpha_tensor, m1)):
        if not (is_constant(scalar, 1) if tensor is None else _acts_as_scalar(tensor, beside)):
            return False
    product_type = vtensor_type((m1_info.shape[0], m2_info.shape[1]), m1_info.dtype, op.context)
    product = _emit("mm", [m1, m2], product_type, op)
    if alpha_tensor is not None:
        product = _emit("mul.Tensor", [product, alpha_tensor], product_type, op)
    if beta_tensor is not None:
        bias = _emit("mul.Tensor", [bias, beta_tensor], bias.type, op)
    _replace(op, "add.Tensor", [bias, product, constant_int(1, op)])
    return True


def _emit(name: str, operands, result_type: ir.Type, before) -> ir.Value:
    return create_aten(name, operands, [result_type], before).result


def _replace(op, name: str, operands) -> None:
    new = create_aten(name, operands, [r.type for r in op.operation.results], op)
    replace_op(op, new.results)


# Consumers with their own rewrite (beside TENSOR_OVERLOADS).
REWRITES = {"rsub.Scalar": _rsub, "add.Tensor": _alpha, "sub.Tensor": _alpha,
            "addcmul": _addc, "addcdiv": _addc, "addmm": _addmm}
