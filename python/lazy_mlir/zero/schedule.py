"""A ZeRO-3 schedule planned from measurements (``zero.initialize(memory_budget=...)``),
as DeepCompile plans its passes from profiles taken in warm-up steps.

The static schedule re-gathers a parameter for backward unless at most
``reuse_bytes`` of other parameters are used between its forward and
backward uses; keeping more parameters gathered saves their second
all-gather (Psi bytes a step at most) and costs memory at the step's peak
(the forward-backward turn). With a budget for the step's buffers, the
engine measures instead of guessing:

1. ``STEPS`` steps of the static schedule after its compile and ``WARM``
   more: the median period between steps, and the step buffers' peak
   (what the compiled step allocates: gathered parameters, activations,
   gradients before their reduction, above what was live when the step
   began: the step memory's ``last_step_peak_bytes`` on CPU, what
   ``lazy_mlir.memory`` reports; the CUDA allocator's peak over the step
   on a GPU);
2. a plan under the budget: the headroom (budget - peak) spent on reuse
   first: kept parameters cost about half the reuse distance at the peak
   (of the bytes used between a layer's two uses, half are the later
   layers' own forward), so ``reuse_bytes`` grows by twice the headroom, up
   to the whole model twice; what is left widens ``prefetch_bytes``;
3. after the plan's one compile, the two schedules take turns in blocks
   (``BLOCKS`` each, planned first; switching compiles nothing, both codes
   are cached), so both are measured side by side under the same load. The
   first ``WARM`` steps of a block are not timed: a step that follows a
   compile or a switch runs colder (its step memory is planned from the
   step before, page faults, caches), and timed they made a plan look
   20% faster than the static schedule when the two were level. The plan
   stays if its peak is within the budget and its median step at least
   ``MARGIN`` faster, else the static schedule does (it holds less).

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

STEPS = 3   # timed steps of a block
WARM = 1    # steps not timed at a block's start (after the compile or the switch)
BLOCKS = 2  # blocks of each schedule taking turns
MARGIN = 0.03  # how much faster the plan's median step must be to stay: below it, step-to-step noise
# steps until the choice is made (at the start of the last, which runs the
# chosen schedule): the static one's compile, WARM and STEPS; the plan's
# compile, then BLOCKS blocks of each; then the deciding one
SETTLED_AFTER = 3 + WARM + STEPS + 2 * BLOCKS * (WARM + STEPS)


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
        # the steps to come while measuring: (schedule, "compile" | "warm" | "timed")
        self._queue: list[tuple[str, str]] = [("static", "compile"), *_block("static")]
        self._ran: tuple[str, str] | None = None  # the step before's entry
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
        now = time.perf_counter()
        if self._ran is not None and self._ran[1] != "compile":  # the step before ran cached code
            schedule, kind = self._ran
            if kind == "timed":
                self._periods[schedule].append(now - self._last)
            self._peaks[schedule] = max(self._peaks[schedule], _peak())
        self._last = now
        _reset_peak()
        if not self._queue:
            if self._phase == "static":
                self._plan(self._measured("static"))
            else:
                self._decide(self._measured("static"), self._measured("planned"))
        if self._queue:
            self._ran = self._queue.pop(0)
            self.engine.pipeline = self.pipelines[self._ran[0]]

    def _measured(self, schedule: str) -> dict:
        """The median step and the peak of ``schedule``, the slowest rank's
        and the highest: every rank decides alike (a rank on another
        schedule would issue other collectives). A collective over the
        engine's group: every rank measures at the same step."""
        both = torch.tensor([statistics.median(self._periods[schedule]) * 1e3, float(self._peaks[schedule])],
                            dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.engine.process_group)
        return {"ms": both[0].item(), "peak_bytes": int(both[1].item())}

    def _plan(self, static: dict) -> None:
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
        self._phase = "compare"
        self._queue = [("planned", "compile")]
        for _ in range(BLOCKS):
            self._queue += [*_block("planned"), *_block("static")]
        metrics.record_zero_schedule(self.report)

    def _decide(self, static: dict, planned: dict) -> None:
        self.report["static"].update(static)
        self.report["planned"].update(planned)
        if planned["peak_bytes"] > self.budget:
            chosen, why = "static", "the plan's peak is over the budget"
        elif planned["ms"] > static["ms"] * (1 - MARGIN):
            chosen, why = "static", (f"the plan's steps are not {MARGIN:.0%} faster "
                                     f"({planned['ms'] / static['ms']:.2f}x the static schedule's)")
        else:
            chosen, why = "planned", f"{planned['ms'] / static['ms']:.2f}x the static schedule's step"
        self.engine.pipeline = self.pipelines[chosen]
        self._done(chosen, why)

    def _done(self, chosen: str, why: str) -> None:
        self.report.update(chosen=chosen, why=why)
        self._phase = "done"
        metrics.record_zero_schedule(self.report)


def _block(schedule: str) -> list[tuple[str, str]]:
    return [(schedule, "warm")] * WARM + [(schedule, "timed")] * STEPS


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
