"""When a group's code becomes a CUDA graph (lazy_mlir.run.cuda_graphs), on the
CPU: the capture itself needs a GPU (tests/test_cuda.py checks it there,
with eager's numbers); here a stand-in for the captured code checks that
each group is captured at its code's second run and replayed from then on,
which groups are never captured, and a stand-in graph that a replay copies
inputs in and fresh outputs out."""
import pytest
import torch

import lazy_mlir
from lazy_mlir import config
from lazy_mlir.lowering import group_lowering
from lazy_mlir.observe import metrics
from lazy_mlir.run import cuda_graphs
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
    monkeypatch.setattr(cuda_graphs, "eligible", lambda cfg, lowered, graph: True)
    monkeypatch.setattr(cuda_graphs, "capture", _StandIn)
    lazy_mlir.init("O1")
    lazy_mlir.native._C.clear_computation_cache()  # an earlier test's graph would keep its executables
    metrics.reset()
    yield _StandIn.made
    lazy_mlir.init("O1")


@pytest.mark.python_wrapper
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
    plain = torch._C.parse_ir("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x)\n  return (%y)")
    drawing = torch._C.parse_ir("graph(%x : Tensor):\n  %g : NoneType = prim::Constant()\n"
                                "  %y : Tensor = aten::rand_like(%x, %g, %g, %g, %g, %g)\n  return (%y)")
    gpu = config.Config(device="cpu")
    gpu.device = "cuda"  # no validate(): this machine may have no GPU
    assert cuda_graphs.eligible(gpu, lowered, plain)
    assert not cuda_graphs.eligible(config.Config(device="cpu"), lowered, plain)
    off = config.Config(device="cpu", cuda_graphs=False)
    off.device = "cuda"
    assert not cuda_graphs.eligible(off, lowered, plain)
    gathered = group_lowering.LoweredGroup(run=None, guards=[], collective_bytes={"all_gather": 64})
    assert not cuda_graphs.eligible(gpu, gathered, plain)
    donated = config.Config(device="cpu", donated_inputs=(0,))
    donated.device = "cuda"
    assert not cuda_graphs.eligible(donated, lowered, plain)
    assert not cuda_graphs.eligible(gpu, lowered, drawing)  # an allow()ed random op: seeds on replay not checked


def test_code_taking_host_inputs_is_not_captured():
    metrics.reset()
    assert cuda_graphs.capture("g.0", lambda inputs: inputs, [torch.ones(2)]) is None
    assert metrics.snapshot()["cuda_graph_refusals"] == {"g.0": "inputs on cpu"}


class _Doubling:
    """Stands in for a captured CUDA graph: its replay writes twice its input buffer into its output buffers."""

    def __init__(self, graphed):
        self.graphed = graphed

    def replay(self):
        x, n = self.graphed.inputs
        self.graphed.outputs[0].copy_(x * 2)
        self.graphed.outputs[1].copy_(n + 1)


def test_a_replay_copies_inputs_in_and_outputs_out():
    """GraphedCode's copies, on the CPU (the capture itself needs a GPU):
    every run's inputs reach the graph's buffers, and its outputs are fresh
    tensors that keep their values after the next replay."""
    graphed = cuda_graphs.GraphedCode.__new__(cuda_graphs.GraphedCode)
    graphed.inputs = [torch.zeros(3), torch.zeros(2, dtype=torch.int64)]
    graphed.outputs = [torch.zeros(3), torch.zeros(2, dtype=torch.int64)]
    graphed._copy_in, graphed._copy_out = cuda_graphs._by_dtype(graphed.inputs), cuda_graphs._by_dtype(graphed.outputs)
    graphed.graph = _Doubling(graphed)
    first = graphed([torch.ones(3), torch.tensor([1, 2])])
    second = graphed([torch.full((3,), 5.0), torch.tensor([7, 8])])
    assert first[0].tolist() == [2.0] * 3 and first[1].tolist() == [2, 3]
    assert second[0].tolist() == [10.0] * 3 and second[1].tolist() == [8, 9]
    assert all(f.data_ptr() != o.data_ptr() for f, o in zip(first + second, graphed.outputs))
