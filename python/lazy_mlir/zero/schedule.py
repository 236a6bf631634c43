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
   reduction, above what was live when the step began: the step memory's
   ``last_step_peak_bytes`` on CPU, what ``lazy_mlir.memory`` reports; the
   CUDA allocator's peak over the step on a GPU);
2. a plan under the budget: the headroom (budget - peak) spent on reuse
   first: kept parameters cost about half the reuse distance at the peak
   (of the bytes used between a layer's two uses, half are the later
   layers' own forward), so ``reuse_bytes`` grows by twice the headroom, up
   to the whole model twice; what is left widens ``prefetch_bytes``;
3. after the plan's one compile, the two schedules take turns step by step
   (``STEPS`` steps each; switching compiles nothing, both codes are
   cached), so both are measured side by side under the same load; the
   plan stays if its peak is within the budget and its median step is
   faster, else the static schedule does.

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
# steps after which the chosen schedule runs: the static one's compile and
# STEPS, the plan's compile, 2 x STEPS taking turns; the next one decides
SETTLED_AFTER = 3 * STEPS + 3


class ProfiledSchedule:
    """Driven by the engine's forward pre-hook (``before_step``) at each
    step's first forward, which may switch ``engine.pipeline`` for the step
    (the engine installs it next)."""

    def __init__(self, engine, budget: int, param_bytes: int):
        self.engine, self.budget, self.param_bytes = engine, budget, param_bytes
        self.pipelines = {"static": engine.pipeline}
        self.report: dict = {"budget_bytes": budget, "chosen": "static", "why": "measuring"}
        self._marks = 0          # mark_steps seen (of any model's steps)
        self._marks_then = -1    # at this engine's last step
        self._step = -1          # this engine's steps (a model's first forward after a mark_step begins one)
        self._compiling = 0      # the step that compiles the schedule it runs (not timed)
        self._ran: str | None = None  # the schedule the step before ran
        self._periods: dict[str, list[float]] = {"static": [], "planned": []}
        self._peaks = {"static": 0, "planned": 0}
        self._last = 0.0
        self._phase = "static"   # "static" (measured alone), "compare" (taking turns), "done"
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
        if self._ran is not None and step - 1 != self._compiling:  # the step before ran cached code
            self._periods[self._ran].append(now - self._last)
            self._peaks[self._ran] = max(self._peaks[self._ran], _peak())
        self._last = now
        _reset_peak()
        if self._phase == "static":
            if len(self._periods["static"]) < STEPS:
                self._ran = "static"
            else:
                self._plan(self._measured("static"), step)
        elif min(map(len, self._periods.values())) < STEPS:
            self._run("static" if self._ran == "planned" else "planned")
        else:
            self._decide(self._measured("static"), self._measured("planned"))

    def _measured(self, schedule: str) -> dict:
        """The median step and the peak of ``schedule``, the slowest rank's
        and the highest: every rank decides alike (a rank on another
        schedule would issue other collectives). A collective over the
        engine's group: every rank measures at the same step."""
        both = torch.tensor([statistics.median(self._periods[schedule]) * 1e3, float(self._peaks[schedule])],
                            dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.engine.process_group)
        return {"ms": both[0].item(), "peak_bytes": int(both[1].item())}

    def _run(self, schedule: str) -> None:
        self.engine.pipeline = self.pipelines[schedule]
        self._ran = schedule

    def _plan(self, static: dict, step: int) -> None:
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
        self.pipelines["planned"] = self.engine.zero_pipeline(reuse_bytes=reuse, prefetch_bytes=prefetch)
        # side by side from here: the static schedule's early steps ran colder
        self._periods, self._peaks = {"static": [], "planned": []}, {"static": 0, "planned": 0}
        self._phase, self._compiling = "compare", step
        self._run("planned")
        metrics.record_zero_schedule(self.report)

    def _decide(self, static: dict, planned: dict) -> None:
        self.report["static"].update(static)
        self.report["planned"].update(planned)
        if planned["peak_bytes"] > self.budget:
            why = "the plan's peak is over the budget"
        elif planned["ms"] >= static["ms"]:
            why = "the plan's steps are not faster"
        else:
            self._run("planned")
            return self._done("planned", f"{planned['ms'] / static['ms']:.2f}x the static schedule's step")
        self._run("static")
        self._done("static", why)

    def _done(self, chosen: str, why: str) -> None:
        self.report.update(chosen=chosen, why=why)
        self._phase = "done"
        metrics.record_zero_schedule(self.report)


_cuda_base = 0  # CUDA bytes allocated at the step's first forward (_reset_peak)


def _on_cuda() -> bool:
    return device_module.backing_device() == "cuda"


def _reset_peak() -> None:
    """On a GPU the CUDA allocator's peak starts again at each step's first
    forward; on CPU the step memory keeps each step's peak itself."""
    global _cuda_base
    if _on_cuda():
        torch.cuda.reset_peak_memory_stats()
        _cuda_base = torch.cuda.memory_allocated()


def _peak() -> int:
    """The step buffers' peak of the step that just ended: the step
    memory's above what was live when the step began on CPU (what
    ``lazy_mlir.memory`` reports), the CUDA allocator's above what was
    allocated at its first forward on a GPU."""
    if _on_cuda():
        return torch.cuda.max_memory_allocated() - _cuda_base
    return _C.step_memory_stats()["last_step_peak_bytes"]
