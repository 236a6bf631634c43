"""fold-copy-ops tells writes and aliases apart by op name (lazy-mlir-opt
imports no torch): check its names against torch's schemas, where
``Tensor(a!)`` marks a written argument and ``Tensor(a)`` an aliased one."""
import re

import pytest
import torch

from mlir_passes.fold_copy_ops import may_alias, writes_by_name

SCHEMAS = [s for s in torch._C._jit_get_all_schemas() if s.name.split("::")[0] in ("aten", "prims")]
# Functional overloads the names count as writing: conservative, and rare.
WRITING_BY_NAME_ONLY = {"aten::_no_grad_embedding_renorm_", "aten::_native_batch_norm_legit.no_stats"}


def qualified(schema) -> str:
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def parts(schema) -> tuple[str, str, str]:
    namespace, base = schema.name.split("::")
    return namespace, base, schema.overload_name


def writes(schema) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def writes_a_tensor(schema) -> bool:
    """A written argument that is or holds tensors (not a Generator, an int[])."""
    return any(a.alias_info is not None and a.alias_info.is_write and re.search(r"Tensor|\bt\b", str(a.type))
               for a in schema.arguments)


def test_every_overload_that_writes_a_tensor_counts_as_writing():
    missed = [str(s) for s in SCHEMAS if writes_a_tensor(s) and not writes_by_name(*parts(s))]
    assert not missed


def test_functional_overloads_do_not_count_as_writing():
    wrong = {qualified(s) for s in SCHEMAS
             if writes_by_name(*parts(s)) and not writes(s)}
    assert wrong <= WRITING_BY_NAME_ONLY


def test_every_overload_whose_result_aliases_an_input_joins_its_class():
    missed = []
    for s in SCHEMAS:
        aliased = any(a.alias_info is not None for a in [*s.arguments, *s.returns])
        if aliased and not writes(s):
            namespace, base, overload = parts(s)
            if not may_alias(f"torch.{namespace}.{base}" + (f".{overload}" if overload else "")):
                missed.append(str(s))
    assert not missed


@pytest.mark.parametrize("name, writes", [
    (("aten", "copy_", ""), True), (("aten", "index_put_", ""), True), (("aten", "_foreach_add_", "Scalar"), True),
    (("aten", "__iand__", "Tensor"), True), (("aten", "add", "out"), True), (("aten", "max", "dim_max"), True),
    (("_c10d_functional", "all_gather_into_tensor_out", ""), True),
    (("aten", "__and__", "Tensor"), False), (("aten", "add", "Tensor"), False), (("aten", "mT", "a"), False),
    (("aten", "outer", ""), False), (("aten", "copy", ""), False),
])
def test_names(name, writes):
    assert writes_by_name(*name) is writes
