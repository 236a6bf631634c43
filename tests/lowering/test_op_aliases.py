"""Overloads named by a Python keyword (aten::random.from) compile."""
import torch

import lazy_mlir
from lazy_mlir.cluster import compilable
from lazy_mlir.lowering.op_aliases import alias_of
from lazy_mlir.observe import metrics
from helpers import LAZY


def test_keyword_overloads_get_an_identifier_named_stand_in():
    op = getattr(torch.ops.aten.random, "from")
    alias = alias_of(op)
    assert alias is not op and alias is alias_of(op)
    assert str(alias) == "lazy_mlir_alias.random_from.default"
    assert str(alias._schema).split("(", 1)[1] == str(op._schema).split("(", 1)[1]  # same arguments and results
    assert alias_of(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor


def test_random_from_compiles_and_draws_what_eager_draws(monkeypatch):
    # random ops stay in TorchScript by default; allowed, random.from must compile
    monkeypatch.setattr(compilable, "DENIED", compilable.DENIED - {"aten::random"})
    monkeypatch.setattr(compilable, "_generation", compilable.generation() + 1)
    lazy_mlir.init("O1")
    metrics.reset()
    try:
        def fn(x):
            return x.random_(3, 1000) * 2 + 1

        torch.manual_seed(7)
        y = fn(torch.zeros(5, 13, device=LAZY))
        torch._lazy.mark_step()
        torch.manual_seed(7)
        torch.testing.assert_close(y.cpu(), fn(torch.zeros(5, 13)))
        s = metrics.snapshot()
        assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] >= 1
    finally:
        lazy_mlir.init("O1")
