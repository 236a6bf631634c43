"""A GPU group's generated code replayed as one CUDA graph.

On a GPU the step is bound by the CPU launching kernels: Inductor's Python
wrapper launches each Triton kernel in turn (docs/gpu.md: GPT-mini's generated
code took as long on the CPU as torch.compile's). At the second run of the
same code, it is captured into a CUDA graph on buffers of its own (the
first run compiled it and autotuned its kernels); that run and each later
one copies the inputs into those buffers (one multi-tensor copy per dtype),
replays the graph (one launch), and copies the outputs out into fresh
tensors.

The copy out is what keeps the results right: LTC holds a group's outputs
as device data for as long as anything refers to them (a loss read after
the next step, a parameter the next step does not update), and the graph's
own buffers are overwritten by its next replay.

Not captured: groups with collectives (NCCL's own streams), with buffers
donated to the code (written in place by design: with CUDA graphs on,
groups are offered none), and code that takes an
input off the GPU (a host value read at launch would be baked in). Random
ops reach a group only when the user lets one in (``compilable.allow``:
otherwise they draw in the TorchScript glue, whose results are inputs);
such a group is not captured (a replay's seeds are not checked on a GPU
yet). A capture that fails
leaves the code running as before, with a warning.
"""
from __future__ import annotations

import warnings

import torch

from ..cluster import compilable
from ..observe import metrics

# Runs of the same code (the first compiles it and autotunes its kernels)
# before it is captured.
RUNS_BEFORE_CAPTURE = 2


def wanted(cfg) -> bool:
    """Whether groups are to be captured: then none takes donated buffers
    (a replay reads and writes buffers of its own; one launch saves more on
    a GPU than writing in place does)."""
    return cfg.cuda_graphs and cfg.device == "cuda"


def eligible(cfg, lowered, graph) -> bool:
    """Whether a group's code may be captured (then its inputs decide, see capture)."""
    return (wanted(cfg) and not lowered.collective_bytes and not cfg.donated_inputs
            and not compilable.draws_random(graph))


class GraphedCode:
    """``run`` (list[Tensor] -> list[Tensor]) captured for inputs laid out as ``inputs``."""

    def __init__(self, run, inputs: list[torch.Tensor]):
        self.inputs = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in inputs]
        # _foreach_copy_ takes its one-launch route for tensors of one dtype
        self._copy_in = _by_dtype(self.inputs)
        self._copy_into(self._copy_in, inputs)
        # Library state made at a first call (cuBLAS workspaces) must exist before the capture.
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            run(self.inputs)
        current.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: a compile on another thread may use the GPU meanwhile
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.outputs = list(run(self.inputs))
        self._copy_out = _by_dtype(self.outputs)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        self._copy_into(self._copy_in, inputs)
        self.graph.replay()
        metrics.count_cuda_graph("replayed")
        fresh = [torch.empty_like(t) for t in self.outputs]
        for positions, graph_outputs in self._copy_out:
            torch._foreach_copy_([fresh[i] for i in positions], graph_outputs)
        return fresh

    @staticmethod
    def _copy_into(by_dtype, sources):
        for positions, buffers in by_dtype:
            torch._foreach_copy_(buffers, [sources[i] for i in positions])


def _by_dtype(tensors) -> list[tuple[list[int], list[torch.Tensor]]]:
    """(positions, tensors) per dtype: the graph's own side of each copy, built once."""
    positions: dict = {}
    for i, t in enumerate(tensors):
        positions.setdefault(t.dtype, []).append(i)
    return [(p, [tensors[i] for i in p]) for p in positions.values()]


def capture(name: str, run, inputs: list[torch.Tensor]) -> GraphedCode | None:
    """The code captured for these inputs, or None (the refusal recorded, and warned when the capture failed)."""
    off_gpu = sorted({str(t.device) for t in inputs if t.device.type != "cuda"})
    if off_gpu:
        metrics.refuse_cuda_graph(name, f"inputs on {', '.join(off_gpu)}")
        return None
    try:
        graphed = GraphedCode(run, inputs)
    except Exception as exc:  # noqa: BLE001 - the code runs as before; the user is told why
        torch.cuda.synchronize()
        first = str(exc).splitlines()[0] if str(exc) else ""
        metrics.refuse_cuda_graph(name, f"capture failed: {type(exc).__name__}: {first}")
        warnings.warn(f"lazy_mlir: {name}'s code is not replayed as a CUDA graph: capture failed "
                      f"({type(exc).__name__}: {first})", RuntimeWarning, stacklevel=2)
        return None
    metrics.count_cuda_graph("captured")
    return graphed
