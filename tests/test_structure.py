"""What the backend does per step: executions, compiles, groups, fallbacks."""

import pytest
import torch

import lazy_mlir
from lazy_mlir.cluster import compilable
from lazy_mlir.models import GPTConfig, gpt_batches, make_gpt
from lazy_mlir.observe import metrics
from lazy_mlir.run import group_compiler
from helpers import LAZY, assert_compiled, assert_same_training, make_adamw, make_mlp, mlp_batches, sgd, train

CPU = torch.device("cpu")


def test_gpt_adamw_one_execution_per_step_no_fallbacks(lazy_level):
    counts = {}

    def after_step(i):
        if i == 1:  # warm-up done
            counts["compiles_warm"] = metrics.snapshot()["compiles"]
            metrics.reset()

    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=96, block_size=16, batch_size=2)  # unseen shapes
    train(lambda: make_gpt(cfg), make_adamw, list(gpt_batches(cfg, 6)), LAZY, after_step=after_step)
    s = metrics.snapshot()
    assert s["mark_steps"] == 4
    assert s["graph_executions"] == 4, metrics.report()
    assert s["fallback_count"] == 0, s["fallbacks"]
    assert s["compiles"] == 0 and s["cache_misses"] == 0  # compile count constant after warm-up
    assert counts["compiles_warm"] == 1  # step 0 traced the steady-state graph (auto_prepare)
    assert_compiled(s, calls=4)  # the steps really ran generated code


@pytest.mark.slow  # 36 s cold; benchmarks/gpt_step.py trains this model and fails on any fallback
def test_gpt_mini_full_size_has_no_fallbacks(lazy_level):
    """GPT-mini (docs/performance.md) (nanoGPT's literal c_attn(x).split(C, dim=2)), AdamW."""
    cfg = GPTConfig()
    batches = list(gpt_batches(cfg, 3))
    train(lambda: make_gpt(cfg), make_adamw, batches, LAZY)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0, s["fallbacks"]
    assert s["graph_executions"] == s["mark_steps"] == 3
    assert s["groups_built"] >= 1 and s["groups_rejected"] == 0
    assert_compiled(s, calls=3)


@pytest.mark.parametrize("lazy_level", ["O1", "O2"], indirect=True)
def test_a_group_of_one_copy_stays_in_torchscript_at_o1(lazy_level):
    """A graph whose one op copies a tensor (a transpose of a weight) would
    compile to the copy TorchScript already runs, once per tensor shape: at
    O1 it stays there, counted as a group left to TorchScript, not a
    fallback. O2 compiles every graph whole. (A detach of device data, a
    checkpoint's, runs no graph at all: lazy_backend/ltc_fixes/pending_data.h.)"""
    weights = [torch.randn(3, n).to(LAZY) for n in (5, 6)]
    torch._lazy.mark_step()
    metrics.reset()
    for w in weights:
        copy = w.t()  # a graph of one t_copy (the weight holds device data)
        torch._lazy.mark_step()
        assert torch.equal(copy.cpu(), w.cpu().t())
    s = metrics.snapshot()
    if lazy_level == "O1":
        assert s["groups_built"] == 0 and s["groups_rejected"] >= 1 and s["compiles"] >= 1, metrics.report()
        assert s["groups_fallen_back"] == {} and s["fallback_count"] == 0
    else:
        assert s["groups_built"] >= 1 and s["groups_rejected"] == 0, metrics.report()
        assert_compiled(s, calls=1)


def test_o0_builds_no_groups(lazy_level):
    lazy_mlir.init("O0")
    train(make_mlp, sgd, mlp_batches(2, batch=3), LAZY)
    s = metrics.snapshot()
    assert s["groups_built"] == 0 and s["group_calls"] == 0
    assert s["graph_executions"] == 2


def test_level_change_recompiles_cached_graphs(lazy_level):
    batches = mlp_batches(2, batch=6)
    lazy_mlir.init("O0")
    train(make_mlp, sgd, batches, LAZY)
    assert metrics.snapshot()["group_calls"] == 0
    lazy_mlir.init("O1")  # same graphs, LTC cache hits: must not run the O0 code
    train(make_mlp, sgd, batches, LAZY)
    assert metrics.snapshot()["group_calls"] == 2
    assert_compiled(calls=2)


def test_failed_group_runs_in_torchscript_with_warning(lazy_level, monkeypatch):
    # tanh stays in TorchScript, so the MLP splits into groups before and after it
    monkeypatch.setattr(compilable, "DENIED", compilable.DENIED | {"aten::tanh"})
    monkeypatch.setattr(compilable, "_generation", compilable.generation() + 1)

    def fail_on_gelu(graph, name):
        if any(n.kind() == "aten::gelu" for n in graph.nodes()):
            raise RuntimeError("injected failure")

    monkeypatch.setattr(group_compiler, "before_build", fail_on_gelu)
    lazy_mlir.init("O1")
    batches = mlp_batches(3, batch=7)
    with pytest.warns(RuntimeWarning, match=r"failed to compile \(RuntimeError: injected failure\)") as record:
        lazy = train(make_mlp, sgd, batches, LAZY)
    message = str(next(w.message for w in record if "injected" in str(w.message)))
    # names ops and the trace-time source line (MLP.forward), not mark_step's
    assert "aten::gelu" in message and "(forward)" in message
    assert_same_training(train(make_mlp, sgd, batches, CPU), lazy)
    s = metrics.snapshot()
    assert s["groups_rejected"] >= 1 and s["groups_built"] >= 1
    assert any("injected failure" in why for why in s["groups_fallen_back"].values())
    assert s["graph_executions"] == s["mark_steps"] == 3


@pytest.mark.python_wrapper
def test_lowering_failure_at_first_run_falls_back_to_torchscript(lazy_level, monkeypatch):
    from lazy_mlir.compile import routes

    monkeypatch.setattr(lazy_mlir.config.current, "cache", False)  # the injected failure is not remembered on disk

    def broken_lowering(graph, inputs, name, cfg):
        raise RuntimeError("injected lowering failure")

    monkeypatch.setattr(routes, "lower_group", broken_lowering)
    batches = mlp_batches(2, batch=19)
    with pytest.warns(RuntimeWarning, match=r"failed to compile \(RuntimeError: injected lowering failure\)"):
        lazy = train(make_mlp, sgd, batches, LAZY)
    assert_same_training(train(make_mlp, sgd, batches, CPU), lazy)
    s = metrics.snapshot()
    assert s["graph_executions"] == s["mark_steps"] == 2 and s["groups_fallen_back"]
    assert s["compiled_group_calls"] == 0  # every group ran its TorchScript subgraph


@pytest.mark.python_wrapper
def test_traced_ops_carry_their_source_lines(lazy_level, monkeypatch):
    """Each node names the user's line it was traced at (errors, dumps and
    recompile explanations read it): two ops on two lines of a loop body
    keep their own line in every iteration (lines are cached per code
    object and instruction)."""
    from lazy_mlir.compile import routes
    graphs = []
    lower = routes.lower_group
    monkeypatch.setattr(routes, "lower_group", lambda graph, *a: graphs.append(graph) or lower(graph, *a))

    def body(x):
        for _ in range(3):
            x = x * 1.25  # MUL
            x = x.sin()  # SIN
        return x

    lines = {tag: i + 1 for i, text in enumerate(open(__file__).read().splitlines())
             for tag in ("MUL", "SIN") if text.endswith(f"# {tag}")}
    x = torch.randn(3, 7)
    out = body(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), body(x))
    sources = [(n.kind(), n.s("source")) for g in graphs for n in g.nodes() if n.kind() in ("aten::mul", "aten::sin")]
    assert len(sources) == 6, sources
    for kind, where in sources:
        tag = "MUL" if kind == "aten::mul" else "SIN"
        assert where == f"{__file__} body {lines[tag]}", (kind, where)
