"""Activations recomputed to fit a memory budget (``init(memory_budget=...)``).

A captured module's backward reads what its forward saved. Recorded with
some of its repeated blocks (its largest ModuleList of one class: a
transformer's layers) as checkpointed regions, the min-cut partitioner
(torch.compile's) saves only those blocks' inputs and the backward
recomputes the rest, one block at a time. How many blocks is chosen from
measured steps, as DeepCompile plans from profiles taken in warm-up steps:

1. the captured modules are recorded with every block checkpointed (the
   least memory) and ``STEPS`` steps measured after the one that compiles
   them: each step's peak (the resident set's high-water mark from one
   step's execution to the next on the CPU; the CUDA allocator's peak on a
   GPU), the step's own buffers and its time;
2. the peak with fewer blocks checkpointed is bounded from that one and
   the bytes the checkpointed blocks' ops produce (known as a forward is
   recorded): saving a block's activations adds at most those. The fewest
   of ``FRACTIONS`` whose bound fits, if any, is recorded and measured in
   turn (one more compile), and stays if it fits, else every block does
   (its code cached: no compile);
3. a budget that every block checkpointed misses is reported (a warning)
   and every block stays checkpointed: the least memory there is.

AOTAutograd's ``activation_memory_budget`` (a knapsack over what to save)
was tried first: in one step's graph, saving nothing recomputes the whole
forward at the backward's first op, which holds what saving held (a small
GPT's step buffers 56.2 MB at fraction 0 against 54.7 saving all).

Only captured modules recompute (the plain loop captures a model's forward
by default); what else a step holds (parameters, the optimizer's state,
the process) is not traded. ``metrics["memory_budget"]`` has what was
measured and chosen, and per captured module the bytes its forward saves
and the ops its backward recomputes at each fraction of blocks.
"""
from __future__ import annotations

import os
import re
import statistics
import sys
import time
import warnings

import torch

from ..native import _C
from ..observe import metrics, syncs
from . import capture

STEPS = 3  # measured steps per fraction of blocks, after the one that compiles it
FRACTIONS = (0.0, 0.25, 0.5, 0.75)  # of the blocks checkpointed, tried after all of them: the fewest that fit
MIB = 1 << 20


def device_bytes(device: str) -> int:
    """The memory of the lazy device's backing device: RAM on the CPU."""
    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_bytes(budget: int | float, device: str) -> int:
    """``init``'s memory_budget in bytes: an int is bytes, a float in (0, 1] a fraction of the device."""
    return budget if isinstance(budget, int) else int(budget * device_bytes(device))


def _peak_and_reset(device: str) -> int:
    """The peak since the last call (bytes); a new measurement begins."""
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return peak
    with open("/proc/self/status") as f:
        peak = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) * 1024
    try:
        with open("/proc/self/clear_refs", "w") as f:  # the high-water mark starts again from the resident size
            f.write("5")
    except OSError:  # not writable here: each measurement is the run's peak so far (never below the step's)
        pass
    return peak


class BudgetPlanner:
    """Driven by each mark_step's execution (``on_mark_step``), which ends
    the interval measured since the last."""

    def __init__(self, budget: int, device: str):
        self.budget, self.device = budget, device
        self.measured: dict[float, dict] = {}  # fraction of blocks checkpointed -> peak, buffers, step time
        self.fraction = 1.0
        self.samples: list[tuple[int, float, int]] = []  # peak, seconds, step buffers' peak
        self.last: tuple[float, int] | None = None  # (time, compiles) at the last mark_step
        self.chosen: float | None = None
        self.why = "measuring"
        # measuring resets the process's high-water mark (getrusage's too): the run's, kept here
        self.run_peak = 0
        capture.set_checkpointed(1.0)
        self._publish()

    def on_mark_step(self) -> None:
        now, compiles = time.perf_counter(), _C.stats()["compiles"]
        peak = _peak_and_reset(self.device)
        self.run_peak = max(self.run_peak, peak)
        last, self.last = self.last, (now, compiles)
        # an interval that compiled holds the compile's memory, not a step's
        if self.chosen is not None or last is None or compiles != last[1]:
            self._publish()
            return
        self.samples.append((peak, now - last[0], _C.step_memory_stats()["last_step_peak_bytes"]))
        if len(self.samples) >= STEPS:
            self._measured()

    def _measured(self) -> None:
        peaks, seconds, buffers = zip(*self.samples)
        # the highest peak, the steady buffers (a first step also allocates what it outputs)
        self.measured[self.fraction] = {"peak_bytes": max(peaks), "step_buffers_bytes": statistics.median(buffers),
                                        "step_seconds": statistics.median(seconds)}
        self.samples = []
        peak = self.measured[self.fraction]["peak_bytes"]
        if self.fraction < 1.0:
            if peak <= self.budget:
                self._choose(self.fraction, "the fewest blocks bounded to fit, measured within the budget")
            else:
                self._choose(1.0, f"{self.fraction:.0%} of the blocks were bounded to fit, measured over it")
            return
        # at most what the blocks' activations take: saving them cannot add more
        spared = capture.checkpointed_bytes()
        if not spared:
            self._choose(0.0, "no captured module was recorded with its blocks checkpointed "
                         "(metrics capture_refusals say why)")
        elif peak > self.budget:
            self._choose(1.0, "the budget is missed with every block checkpointed")
            warnings.warn(f"lazy_mlir: memory_budget {self.budget / MIB:,.0f} MiB: the step peaks at "
                          f"{peak / MIB:,.0f} MiB with every repeated block of the captured modules checkpointed; "
                          "the rest is parameters, optimizer state and the process (lazy_mlir.memory.report())",
                          stacklevel=2)
        else:
            fitting = [f for f in FRACTIONS if peak + (1.0 - f) * spared <= self.budget]
            if fitting:
                self._try(fitting[0])
            else:
                self._choose(1.0, "fewer blocks checkpointed are not bounded to fit")

    def _try(self, fraction: float) -> None:
        self.fraction = fraction
        capture.set_checkpointed(fraction)
        print(f"lazy_mlir: memory_budget {self.budget / MIB:,.0f} MiB: recording the captured modules again "
              f"with {fraction:.0%} of their blocks checkpointed (one more compile)", file=sys.stderr, flush=True)
        self._publish()

    def _choose(self, fraction: float, why: str) -> None:
        self.chosen, self.why = fraction, why
        capture.set_checkpointed(fraction)
        self._publish()

    def _publish(self) -> None:
        metrics.record_memory_budget({
            "budget_bytes": self.budget, "measured": {f: dict(m) for f, m in self.measured.items()},
            "chosen_fraction": self.chosen, "why": self.why, "partitions": capture.partition_stats(),
            "run_peak_bytes": self.run_peak})


_planner: BudgetPlanner | None = None


def _on_mark_step() -> None:
    if _planner is not None:
        _planner.on_mark_step()


syncs.at_mark_step(_on_mark_step)


def configure(budget: int | float | None, device: str) -> None:
    """At ``init``: a planner for ``budget``, or none (no block
    checkpointed). Records made under an earlier budget stay, under their
    keys."""
    global _planner
    capture.set_checkpointed(0.0, measure=False)
    metrics.record_memory_budget({})
    _planner = BudgetPlanner(budget_bytes(budget, device), device) if budget is not None else None
