"""When a group's code becomes a CUDA graph (lazy_mlir.cuda_graphs), on the
CPU: the capture itself needs a GPU (tests/test_cuda.py checks it there,
with eager's numbers); here a stand-in for the captured code checks that
each group is captured at its code's second run and replayed from then on,
and which groups are never captured."""
import pytest
import torch

import lazy_mlir
from lazy_mlir import config, cuda_graphs, group_lowering, metrics
from helpers import LAZY, assert_compiled, assert_same_training, make_mlp, mlp_batches, sgd, train

CPU = torch.device("cpu")


class _StandIn:
    """Takes cuda_graphs.capture's place: runs the code, counts its calls."""
    made: list = []

    def __init__(self, name, run, inputs):
        self.run, self.calls = run, 0
        _StandIn.made.append(self)

    def __call__(self, inputs):
        self.calls += 1
        return self.run(inputs)


@pytest.fixture
def captured(monkeypatch):
    _StandIn.made = []
    monkeypatch.setattr(cuda_graphs, "refusal", lambda cfg, lowered: None)
    monkeypatch.setattr(cuda_graphs, "capture", _StandIn)
    lazy_mlir.init("O1")
    lazy_mlir._C.clear_computation_cache()  # an earlier test's graph would keep its executables
    metrics.reset()
    yield _StandIn.made
    lazy_mlir.init("O1")


def test_each_group_is_captured_at_its_second_run_and_replayed_after(captured):
    batches = mlp_batches(steps=5)
    eager = train(make_mlp, sgd, batches, CPU)
    lazy = train(make_mlp, sgd, batches, LAZY)
    assert_same_training(eager, lazy)
    s = metrics.snapshot()
    assert_compiled(s, calls=5)
    # at most one capture per group (a graph run once, as a first step's can be, has none)
    assert 0 < len(captured) <= s["groups_built"], metrics.report()
    # every run but each group's first went to the captured code
    assert sum(c.calls for c in captured) == s["compiled_group_calls"] - s["groups_built"], metrics.report()


def test_which_groups_are_never_captured():
    lowered = group_lowering.LoweredGroup(run=None, guards=[])
    gpu = config.Config(device="cpu")
    gpu.device = "cuda"  # no validate(): this machine may have no GPU
    assert cuda_graphs.refusal(gpu, lowered) is None
    assert cuda_graphs.refusal(config.Config(device="cpu"), lowered) == "off"
    off = config.Config(device="cpu", cuda_graphs=False)
    off.device = "cuda"
    assert cuda_graphs.refusal(off, lowered) == "off"
    gathered = group_lowering.LoweredGroup(run=None, guards=[], collective_bytes={"all_gather": 64})
    assert cuda_graphs.refusal(gpu, gathered) == "collectives"
    donated = config.Config(device="cpu", donated_inputs=(0,))
    donated.device = "cuda"
    assert cuda_graphs.refusal(donated, lowered) == "donated inputs"


def test_code_taking_host_inputs_is_not_captured():
    metrics.reset()
    assert cuda_graphs.capture("g.0", lambda inputs: inputs, [torch.ones(2)]) is None
    assert metrics.snapshot()["cuda_graph_refusals"] == {"g.0": "inputs on cpu"}
