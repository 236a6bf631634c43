"""A ZeRO-3 schedule planned from measurements (``zero.initialize(memory_budget=...)``),
as DeepCompile plans its passes from profiles taken in warm-up steps.

The static schedule re-gathers a parameter for backward unless at most
``reuse_bytes`` of other parameters are used between its forward and
backward uses; keeping more parameters gathered saves their second
all-gather (Psi bytes a step at most) and costs memory at the step's peak
(the forward-backward turn). With a budget for the step's buffers, the
engine measures instead of guessing:

1. ``STEPS`` steps of the static schedule after its compile: the median
   period between steps, and the step buffers' peak (what the compiled step
   allocates: gathered parameters, activations, gradients before their
   reduction; ``_C.step_memory_stats`` on CPU, the CUDA allocator's peak
   over the step on a GPU);
2. a plan under the budget: the headroom (budget - peak) spent on reuse
   first: kept parameters cost about half the reuse distance at the peak
   (of the bytes used between a layer's two uses, half are the later
   layers' own forward), so ``reuse_bytes`` grows by twice the headroom, up
   to the whole model twice; what is left widens ``prefetch_bytes``;
3. ``STEPS`` steps of the plan after its one compile, measured alike; the
   plan stays if its peak is within the budget and its steps are faster,
   else the static schedule comes back (its code is still cached: no
   compile).

Every rank takes the slowest rank's time and the highest peak (an
all-reduce), so all ranks choose alike.

What was measured and chosen is ``metrics["zero_schedule"]``.
"""
from __future__ import annotations

import statistics
import time
import weakref

import torch
import torch.distributed as dist

from ..native import _C
from ..observe import metrics, syncs
from ..trace import device_module

STEPS = 3  # timed steps per schedule, after the step that compiles it


class ProfiledSchedule:
    """Driven by the engine's forward pre-hook (``before_step``) at each
    step's first forward; steps are counted at mark_step."""

    def __init__(self, engine, budget: int, param_bytes: int):
        self.engine, self.budget, self.param_bytes = engine, budget, param_bytes
        self.static_pipeline = engine.pipeline
        self.report: dict = {"budget_bytes": budget, "chosen": "static", "why": "measuring"}
        self._marks = 0          # mark_steps seen (of any model's steps)
        self._marks_then = -1    # at this engine's last step
        self._step = -1          # this engine's steps (a model's first forward after a mark_step begins one)
        self._start = 0          # the step the schedule being measured compiled at
        self._periods: list[float] = []
        self._last = 0.0
        self._phase = "static"   # "static", "planned", then "done"
        own = weakref.ref(self)
        syncs.at_mark_step(lambda: own() is not None and own()._count())
        metrics.record_zero_schedule(self.report)

    def _count(self) -> None:
        self._marks += 1

    def before_step(self) -> None:
        if self._phase == "done" or self._marks == self._marks_then:
            return  # another forward of the same step
        self._marks_then = self._marks
        self._step = step = self._step + 1
        now = time.perf_counter()
        if step == self._start + 1:  # the compile step is over: measure from here
            _reset_peak()
            self._periods, self._last = [], now
            return
        if step > self._start + 1:
            self._periods.append(now - self._last)
            self._last = now
        if step < self._start + 1 + STEPS:
            return
        measured = self._agreed(statistics.median(self._periods) * 1e3, _peak())
        if self._phase == "static":
            self._planned(measured, step)
        else:
            self._decide(measured)

    def _agreed(self, ms: float, peak: int) -> dict:
        """The slowest rank's step time and the highest peak: every rank
        decides alike (a rank on another schedule would issue other
        collectives). A collective over the engine's group: every rank
        measures at the same step."""
        both = torch.tensor([ms, float(peak)], dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.engine.process_group)
        return {"ms": both[0].item(), "peak_bytes": int(both[1].item())}

    def _planned(self, static: dict, step: int) -> None:
        self.report["static"] = {**static, "reuse_bytes": self.engine.reuse_bytes,
                                 "prefetch_bytes": self.engine.prefetch_bytes}
        headroom = self.budget - static["peak_bytes"]
        if not static["peak_bytes"]:
            return self._done("static", "no peak measured (the step memory is off)")
        if headroom <= 0:
            return self._done("static", "the static schedule's peak is at or over the budget")
        whole = 2 * self.param_bytes  # every gather of a step: forward's and backward's
        if self.engine.reuse_bytes >= whole and self.engine.prefetch_bytes >= whole:
            return self._done("static", "the static schedule keeps every parameter gathered already")
        # the headroom to reuse first (it saves backward's gathers), the rest to prefetching
        reuse = max(self.engine.reuse_bytes, min(self.engine.reuse_bytes + 2 * headroom, whole))
        left = headroom - (reuse - self.engine.reuse_bytes) // 2
        prefetch = max(self.engine.prefetch_bytes, min(self.engine.prefetch_bytes + left, whole))
        self.report["planned"] = {"reuse_bytes": reuse, "prefetch_bytes": prefetch}
        self.engine.pipeline = self.engine.zero_pipeline(reuse_bytes=reuse, prefetch_bytes=prefetch)
        self._phase, self._start = "planned", step
        metrics.record_zero_schedule(self.report)

    def _decide(self, planned: dict) -> None:
        self.report["planned"].update(planned)
        static = self.report["static"]
        if planned["peak_bytes"] > self.budget:
            why = "the plan's peak is over the budget"
        elif planned["ms"] >= static["ms"]:
            why = "the plan's steps are not faster"
        else:
            return self._done("planned", f"{planned['ms'] / static['ms']:.2f}x the static schedule's step")
        self.engine.pipeline = self.static_pipeline
        self._done("static", why)

    def _done(self, chosen: str, why: str) -> None:
        self.report.update(chosen=chosen, why=why)
        self._phase = "done"
        metrics.record_zero_schedule(self.report)


_cuda_base = 0  # CUDA bytes allocated at the last _reset_peak


def _on_cuda() -> bool:
    return device_module.backing_device() == "cuda"


def _reset_peak() -> None:
    global _cuda_base
    _C.reset_step_memory_peak()
    if _on_cuda():
        torch.cuda.reset_peak_memory_stats()
        _cuda_base = torch.cuda.memory_allocated()


def _peak() -> int:
    """The step buffers' peak since _reset_peak: the step memory's on CPU,
    the CUDA allocator's above what was allocated then on a GPU."""
    if _on_cuda():
        return torch.cuda.max_memory_allocated() - _cuda_base
    return _C.step_memory_stats()["peak_bytes"]
