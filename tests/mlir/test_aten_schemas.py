"""The table-driven rewrites keep operand lists as they are, so the result
is still ATen 1:1: check each pair of overloads against torch's schemas."""
import pytest
import torch

from mlir_passes.fold_copy_ops import VIEW_OF_COPY
from mlir_passes.scalar_implicit_to_tensor import TENSOR_OVERLOADS


def argument_types(name: str) -> list[str]:
    """``"transpose_copy.int"`` -> the argument types of torch.ops.aten.transpose_copy.int."""
    op, _, overload = name.partition(".")
    schema = getattr(getattr(torch.ops.aten, op), overload or "default")._schema
    return [str(a.type) for a in schema.arguments]


@pytest.mark.parametrize("copy_op, view_op", VIEW_OF_COPY.items())
def test_view_op_takes_the_copy_ops_operands(copy_op, view_op):
    assert argument_types(view_op) == argument_types(copy_op)


@pytest.mark.parametrize("scalar_op, overload", TENSOR_OVERLOADS.items())
def test_tensor_overload_takes_tensors_where_the_scalars_were(scalar_op, overload):
    expected = argument_types(scalar_op)
    for i in overload.scalars:
        expected[i] = expected[i].replace("number", "Tensor")
    assert argument_types(overload.target) == expected
