"""A graph's fusion groups compile side by side (``parallel_compile``): its
first execution runs them in TorchScript, their code is generated at its end,
here and in a worker process; every step equals eager, and nothing compiles
twice. (Several groups a step: helpers.StochasticMLP's draws read computed
values.)"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lazy_mlir.cache import compile_cache
from lazy_mlir.compile import parallel as parallel_compile
from lazy_mlir.lowering import portable_graph
from lazy_mlir.observe import metrics
from lazy_mlir.compile import deferred
from lazy_mlir.run import executables
from helpers import LAZY, StochasticMLP, assert_same_training, sgd, train
from test_compile_cache import _hand_groups_over_again

CPU = torch.device("cpu")


def make_model():
    torch.manual_seed(0)
    return StochasticMLP().double()


def batches(steps=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
            for _ in range(steps)]


def run(device, snapshots=None):
    torch.manual_seed(123)  # the same draws in both runs
    after = (lambda i: snapshots.append(metrics.snapshot())) if snapshots is not None else None
    return train(make_model, sgd, batches(), device, after_step=after)


@pytest.fixture
def parallel(lazy_level, monkeypatch, tmp_path):
    """One compile worker, taken whatever the groups' size; a cache folder of
    the test's own, and groups handed over anew with nothing in memory from
    other tests: every group misses."""
    monkeypatch.setattr(parallel_compile, "MIN_OPS_FOR_WORKERS", 0)
    _hand_groups_over_again(compile_workers=1, cache_dir=str(tmp_path / "cache"))
    metrics.reset()
    yield
    compile_cache.clear_memory()


@pytest.fixture
def worker_first(monkeypatch):
    """This process's compiles wait until the worker started: with Inductor's
    cache warm, they would otherwise all be done before (it takes ~8 s)."""
    import threading
    from lazy_mlir.compile import isolated as isolated_compile
    started = threading.Event()
    real_ready, real_generate = parallel_compile.WorkerProcess.wait_ready, deferred.generate_code
    real_isolated = isolated_compile.generate

    def ready(self, timeout=parallel_compile.START_TIMEOUT):
        ok = real_ready(self, timeout)
        started.set()
        return ok

    def generate(prepared, cfg):
        assert started.wait(timeout=120)
        return real_generate(prepared, cfg)

    def generate_isolated(*args, **kwargs):  # the C++ wrapper's route (the default) waits too
        assert started.wait(timeout=120)
        return real_isolated(*args, **kwargs)

    monkeypatch.setattr(parallel_compile.WorkerProcess, "wait_ready", ready)
    monkeypatch.setattr(deferred, "generate_code", generate)
    monkeypatch.setattr(isolated_compile, "generate", generate_isolated)


def test_groups_compile_beside_each_other_and_match_eager(parallel, worker_first, tmp_path):
    eager = run(CPU)
    steps = []
    assert_same_training(eager, run(LAZY, steps), rtol=1e-12, atol=1e-12)
    first, last = steps[0], steps[-1]
    groups = first["groups_built"]
    assert groups >= 2, metrics.report()
    # the first step ran every group in TorchScript, then compiled them: some in the worker
    assert first["interpreted_group_calls"] == groups and first["compiled_group_calls"] == 0, metrics.report()
    assert first["worker_compiles"] >= 1, metrics.report()
    # later steps ran generated code only, and nothing compiled again
    assert last["compiled_group_calls"] == (len(steps) - 1) * groups, metrics.report()
    assert last["interpreted_group_calls"] == groups and last["groups_fallen_back"] == {}, metrics.report()
    assert last["group_cache_misses"] == groups and last["recompiles"] == [], metrics.report()
    assert last["fallback_count"] == 0 and last["graph_executions"] == len(steps)
    assert "groups' code generated beside this process" in metrics.report()

    # What the worker generated was stored like any compile: a new process
    # (here: groups handed over again, memory forgotten) reads every group from the folder.
    _hand_groups_over_again(cache_dir=str(tmp_path / "cache"))
    metrics.reset()
    steps = []
    assert_same_training(eager, run(LAZY, steps), rtol=1e-12, atol=1e-12)
    s = steps[-1]
    assert s["group_cache_disk_hits"] == groups and s["group_cache_misses"] == 0, metrics.report()
    assert s["interpreted_group_calls"] == 0 and s["compiled_group_calls"] == len(steps) * groups


@pytest.mark.parametrize("worker", ["fails", "never_starts"])
def test_what_a_worker_cannot_do_compiles_here(parallel, monkeypatch, worker):
    if worker == "fails":
        monkeypatch.setattr(parallel_compile.WorkerProcess, "compile",
                            lambda self, name, graph, layouts: ("failed", "injected"))
    else:
        monkeypatch.setattr(parallel_compile.WorkerProcess, "wait_ready", lambda self, timeout=0: False)
    eager = run(CPU)
    steps = []
    assert_same_training(eager, run(LAZY, steps), rtol=1e-12, atol=1e-12)
    s = steps[-1]
    groups = s["groups_built"]
    assert s["worker_compiles"] == 0 and s["groups_fallen_back"] == {}, metrics.report()
    assert s["compiled_group_calls"] == (len(steps) - 1) * groups and s["group_cache_misses"] == groups


def test_the_exported_graph_travels_node_for_node():
    """Pickling a GraphModule traces its code again: aten.arange(0, 4) would
    come back as a constant, which standalone_compile turns into an input."""
    table = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def f(x):
        return torch.ops.aten.add.Tensor(torch.ops.aten.arange.start_step(0, 4, 1), x * table)

    gm = make_fx(f)(torch.ones(4))
    again = portable_graph.loads(portable_graph.dumps(gm))
    assert again.code == gm.code and "arange" in again.code
    x = torch.randn(4)
    torch.testing.assert_close(again(x), gm(x))


def test_in_layout_copies_into_transposed_and_expanded_strides():
    t = torch.arange(6.0).reshape(2, 3)
    moved = executables.in_layout(t, (1, 2))
    assert moved.stride() == (1, 2) and torch.equal(moved, t)
    ones = torch.ones(4, 3)
    expanded = executables.in_layout(ones, (1, 0))
    assert expanded.stride() == (1, 0) and torch.equal(expanded, ones)
