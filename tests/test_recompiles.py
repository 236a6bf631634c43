"""Recompile explanations: which group, what changed against its nearest
variant, from which step; the LAZY_MLIR_LOG switch; the variant limit."""
import re

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir import config
from lazy_mlir.observe import metrics
from helpers import LAZY

HERE = "test_recompiles.py"


def _run(fn, *inputs):
    out = fn(*(x.to(LAZY) for x in inputs))
    torch._lazy.mark_step()  # the step source every explanation names
    return out.cpu()


def _only_recompile() -> dict:
    records = metrics.snapshot()["recompiles"]
    assert len(records) == 1, metrics.report()
    return records[0]


def _line_of_mark_step() -> int:
    import inspect
    source, first = inspect.getsourcelines(_run)
    return first + next(i for i, line in enumerate(source) if "mark_step" in line)


def test_new_shape_names_the_input_and_the_step(lazy_level):
    def fn(x):
        return F.softplus(x * 3).sum(1)

    for rows in (4, 3):
        x = torch.randn(rows, 41)
        torch.testing.assert_close(_run(fn, x), fn(x))
    record = _only_recompile()
    assert re.fullmatch(rf"input \d+ \(used by aten::mul at .*{HERE}:\d+ \(fn\)\): shape \(4, 41\) -> \(3, 41\)",
                        record["changes"][0]), record
    assert record["step_source"].endswith(f"{HERE}:{_line_of_mark_step()} (_run)"), record
    assert "softplus" in record["ops"] and record["previous"] != record["group"]
    report = metrics.report()
    assert "recompiles           1" in report and "shape (4, 41) -> (3, 41)" in report


def test_new_strides_of_the_same_shape(lazy_level):
    def fn(x):
        return (x - 0.5).abs().cumsum(0)

    a = torch.randn(43, 43)
    for x in (a, a.t()):
        torch.testing.assert_close(_run(fn, x), fn(x))
    assert re.search(r"strides \(43, 1\) -> \(1, 43\)", _only_recompile()["changes"][0])


def test_new_dtype(lazy_level):
    def fn(x):
        return (x * x).rsqrt().amax(0)

    for dtype in (torch.float32, torch.float64):
        x = torch.rand(5, 47, dtype=dtype) + 0.5
        torch.testing.assert_close(_run(fn, x), fn(x))
    assert "dtype torch.float32 -> torch.float64" in _only_recompile()["changes"][0]


def test_new_value_of_a_scalar_baked_into_the_code(lazy_level):
    x = torch.randn(6, 53)
    for threshold in (0.25, 0.5):
        def fn(t):
            return F.threshold(t, threshold, 0.0)
        torch.testing.assert_close(_run(fn, x), fn(x))
    assert re.fullmatch(r"input \d+ \(used by aten::threshold at .*\): value 0.25 -> 0.5 \(baked into the code\)",
                        _only_recompile()["changes"][0])


def test_first_compile_of_a_group_is_not_a_recompile(lazy_level):
    x = torch.randn(2, 59)
    _run(lambda t: t.sin() + t.cos(), x)
    _run(lambda t: t.tan(), x)  # another group: its first compile
    assert metrics.snapshot()["recompiles"] == []


def test_log_switch_prints_each_recompile(lazy_level, capfd, monkeypatch):
    monkeypatch.setenv("LAZY_MLIR_LOG", "recompiles")
    assert config.Config().logs("recompiles")
    lazy_mlir.init("O1", progress=False)

    def fn(x):
        return x.exp2().mean(0)

    for rows in (2, 5):
        _run(fn, torch.randn(rows, 61))
    err = capfd.readouterr().err
    assert re.search(rf"lazy_mlir: recompiling \S+ \[aten::exp2.*\], step at .*{HERE}:\d+ \(_run\), vs \S+: "
                     r"input \d+ .*shape \(2, 61\) -> \(5, 61\)", err), err


def test_no_log_without_the_switch(lazy_level, capfd):
    lazy_mlir.init("O1", progress=False, log="")

    def fn(x):
        return x.expm1().mean(0)

    for rows in (2, 5):
        _run(fn, torch.randn(rows, 67))
    assert "recompiling" not in capfd.readouterr().err and len(metrics.snapshot()["recompiles"]) == 1


def test_warns_once_past_the_variant_limit(lazy_level):
    # static sizes: shape-generic code would serve rows 3 and 4 (test_shape_generic)
    lazy_mlir.init("O1", progress=False, recompile_limit=2, dynamic="static")

    def fn(x):
        return x.sigmoid().sum(0)

    with pytest.warns(RuntimeWarning, match=r"has compiled 3 variants \(more than recompile_limit=2\)") as caught:
        for rows in (1, 2, 3, 4):
            _run(fn, torch.randn(rows, 71))
    assert sum("recompile_limit" in str(w.message) for w in caught) == 1
    assert len(metrics.snapshot()["recompiles"]) == 3


def test_new_configuration_names_the_field(lazy_level):
    def fn(x):
        return (x + 1).log().sum(0)

    x = torch.rand(3, 73)
    _run(fn, x)
    # LTC recompiles its cached graph for the new configuration; the group's inputs are the same
    lazy_mlir.init("O1", pipeline="fold-copy-ops,scalar-implicit-to-tensor,specialize-scalars")
    torch.testing.assert_close(_run(fn, x), fn(x))
    assert re.fullmatch(r"config pipeline \w+ -> \w+", _only_recompile()["changes"][0])
