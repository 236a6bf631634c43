"""A group at a new size runs in TorchScript while its shape-generic code
compiles on the worker thread (``Config.background_compile``), then runs
that code; every step equals eager."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import lazy_mlir
from lazy_mlir.compile import background, shape_generic
from lazy_mlir.observe import metrics
from helpers import LAZY, assert_compiled, train_token_batches
from test_shape_generic import _twins

# the per-op trace's sizes (automatic capture records the first size apart,
# and the shape-generic code of its later sizes starts one size later)
pytestmark = pytest.mark.op_by_op("the per-op trace's shape-generic sizes")

CPU = torch.device("cpu")


@pytest.fixture
def gated(lazy_level, monkeypatch):
    """No disk cache; generic compiles wait for ``gate`` (set by the test)
    and are listed in ``calls``."""
    monkeypatch.setattr(lazy_mlir.config.current, "cache", False)
    monkeypatch.setattr(lazy_mlir.config.current, "background_compile", True)
    gate, calls = threading.Event(), []
    real = shape_generic.compile_generic

    def waiting(graph, inputs, name, cfg, sighting, planned):
        calls.append(name)
        assert gate.wait(timeout=120)
        return real(graph, inputs, name, cfg, sighting, planned)

    monkeypatch.setattr(shape_generic, "compile_generic", waiting)
    yield gate, calls
    gate.set()
    lazy_mlir.wait_for_compiles()


def test_new_sizes_run_in_torchscript_until_the_generic_code_is_ready(gated):
    gate, calls = gated
    switch_interval = sys.getswitchinterval()
    eager, lazy = _twins(width=23)
    before = [(2, 8), (2, 8), (2, 12), (2, 12), (2, 16)]  # 12: a second size; 16: a third, while it compiles
    after = [(2, 16), (2, 12), (2, 20), (2, 8)]
    want = train_token_batches(eager, before + after, CPU)  # SGD without momentum: a new optimizer per call is the same
    got, _, waiting = train_token_batches(lazy, before, LAZY)
    assert calls and len(calls) == 1, calls  # the third size waits for the second's compile
    for s in waiting[:2]:
        assert_compiled(s)
    for s in waiting[2:]:  # its TorchScript subgraph, counted as such, not as a failure
        assert s["interpreted_group_calls"] == 1 and s["compiled_group_calls"] == 0, metrics.report()
        assert s["groups_fallen_back"] == {} and s["generic_compiles"] == 0
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0
    assert "TorchScript while their code compiled" in metrics.report()
    # the GIL changes hands often while the compile runs (the trace drops it in every op)
    assert sys.getswitchinterval() == pytest.approx(background.SWITCH_INTERVAL)

    gate.set()
    assert lazy_mlir.wait_for_compiles(timeout=300)
    assert sys.getswitchinterval() == pytest.approx(switch_interval)
    more, params, ready = train_token_batches(lazy, after, LAZY)
    for s in ready:  # every size, 8 aside, from the one generic compile
        assert_compiled(s)
        assert s["generic_compiles"] == 0 and s["graph_executions"] == 1
    assert [s["generic_hits"] for s in ready[1:3]] == [1, 1], ready
    # a group that waited for the compile counted its cache miss once, when it first ran
    assert [s["group_cache_misses"] for s in waiting[2:]] == [1, 0, 1]
    assert [s["group_cache_misses"] for s in ready] == [0, 0, 1, 0], ready
    assert len(calls) == 1
    _assert_same(want, torch.cat([got, more]), params)


@pytest.mark.python_wrapper
def test_a_failed_background_compile_compiles_the_static_form(gated, monkeypatch):
    gate, _ = gated

    def broken(*args, **kwargs):
        raise RuntimeError("injected background failure")

    monkeypatch.setattr(shape_generic, "lower_group", broken)
    eager, lazy = _twins(width=19)
    shapes = [(2, 8), (2, 8), (2, 12), (2, 12), (2, 16)]
    want = train_token_batches(eager, shapes, CPU)
    got, _, steps = train_token_batches(lazy, shapes[:3], LAZY)
    assert steps[2]["interpreted_group_calls"] == 1
    with pytest.warns(RuntimeWarning, match=r"could not be compiled shape-generic \(RuntimeError: injected"):
        gate.set()
        lazy_mlir.wait_for_compiles(timeout=300)
    more, params, steps = train_token_batches(lazy, shapes[3:], LAZY)
    # length 12 compiles static at its next run; 16 too: the family is not tried generic again
    for s in steps:
        assert_compiled(s)
        assert s["stage_runs"].get("ts_to_fx") == 1 and s["generic_compiles"] == 0, s["stage_runs"]
    assert [s["generic_failed"] for s in steps] == [0, 0]
    _assert_same(want, torch.cat([got, more]), params)


def test_a_background_compile_leaves_the_training_threads_rng_alone(gated, monkeypatch):
    """AOTAutograd and Inductor wrap a compile in Dynamo's
    preserve_rng_state, which sets the process's RNG state back at the end
    to what it was at the start: from a worker thread that rewound the
    draws the training thread made meanwhile (dropout masks came again; 549
    of 631 draws in one run). Here the generic compile runs inside both
    bindings of it (Inductor's cache may serve the compile itself without
    one) while this thread draws: the draws are the seeded sequence's."""
    gate, calls = gated
    gated_compile = shape_generic.compile_generic

    def compile_like_aot_autograd(*args):
        from torch._functorch import aot_autograd
        with aot_autograd.preserve_rng_state(), torch._dynamo.utils.preserve_rng_state():
            return gated_compile(*args)

    monkeypatch.setattr(shape_generic, "compile_generic", compile_like_aot_autograd)
    _, lazy = _twins(width=13)
    train_token_batches(lazy, [(2, 8), (2, 8), (2, 12)], LAZY)  # a second length: its generic compile waits at the gate
    deadline = time.monotonic() + 120
    while not calls and time.monotonic() < deadline:  # the worker thread reaches it when it is scheduled
        time.sleep(0.01)
    assert len(calls) == 1
    torch.manual_seed(7)
    draws = [torch.rand(8)]
    gate.set()
    while background._pending:
        draws.append(torch.rand(8))
        time.sleep(0.002)
    assert lazy_mlir.wait_for_compiles(timeout=300)
    draws.append(torch.rand(8))
    torch.manual_seed(7)
    seeded = [torch.rand(8) for _ in draws]
    differ = sum(not torch.equal(a, b) for a, b in zip(draws, seeded))
    assert differ == 0, f"{differ} of {len(draws)} draws differ from the seeded sequence"


def _assert_same(eager, losses, params):
    """Losses and final parameters equal eager's (fp64)."""
    torch.testing.assert_close(losses, eager[0], rtol=1e-12, atol=1e-12)
    for name, p in eager[1].items():
        torch.testing.assert_close(params[name], p, rtol=1e-12, atol=1e-12, msg=name)


def test_a_process_ending_while_a_compile_runs_waits_for_it(tmp_path):
    """A worker thread stopped inside torch's C++ code at interpreter exit
    aborts the process ("terminate called without an active exception"). The
    static compiles run in the compile worker, so the generic one is the
    first to run Inductor in this process: its imports at exit must not fail
    ("can't register atexit after shutdown")."""
    script = textwrap.dedent("""
        import sys, time
        import torch
        import lazy_mlir
        from lazy_mlir import metrics
        from lazy_mlir.compile import shape_generic
        lazy_mlir.init("O1", cache_dir=%r, progress=True, background_compile=True,
                       isolated_compile=True, cpp_wrapper=True, compile_workers=1)
        real = shape_generic.compile_generic
        def slow(*args):
            time.sleep(2)
            out = real(*args)
            print("generic compiled", file=sys.stderr, flush=True)
            return out
        shape_generic.compile_generic = slow
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to("lazy")
        for t in (8, 8, 12):
            model(torch.randn(2, t, 16).to("lazy")).sum().backward()
            torch._lazy.mark_step()
        assert metrics.snapshot()["interpreted_group_calls"] == 1, metrics.report()
        assert metrics.snapshot()["stage_runs"].get("isolated_compile") == 2, metrics.report()
        print("training done", file=sys.stderr, flush=True)
    """) % str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tail = proc.stderr[proc.stderr.index("training done"):]
    assert "waiting for 1 background compile(s) to finish before exit" in tail, proc.stderr[-3000:]
    assert "generic compiled" in tail and "could not be compiled" not in tail, tail


@pytest.fixture
def repeat_in_torchscript():
    """aten::repeat left to TorchScript: it splits a graph into two groups."""
    lazy_mlir.compilable.deny("aten::repeat")
    lazy_mlir.init("O1", cache=False, background_compile=True, progress=False)
    yield
    lazy_mlir.compilable.allow("aten::repeat")
    lazy_mlir.init("O1")


@pytest.mark.compiles_in_step("the graph's first run compiles its groups in the step, as the name says (compile workers would defer them)")
def test_a_graph_first_run_compiles_its_groups_of_one_family_in_the_step(lazy_level, repeat_in_torchscript):
    """Two groups of one family at two sizes in one graph (T5's encoder and
    decoder attention): its first run compiles anyway, so the second size
    compiles its generic code there and then, not in the background."""
    x = torch.randn(4, 9, dtype=torch.float64)

    def step(x):
        h = x * 3 + 1  # group 1, (4, 9)
        k = h.repeat(1, 2) * 3 + 1  # TorchScript, then group 2: the same ops at (4, 18)
        return h, h.sum(), k, k.sum()

    metrics.reset()
    got = step(x.to(LAZY))
    torch._lazy.mark_step()
    for g, w in zip(got, step(x)):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-14, atol=1e-14)
    s = metrics.snapshot()
    assert s["groups_built"] == 2 and s["generic_compiles"] == 1, metrics.report()
    assert_compiled(s, calls=2)
