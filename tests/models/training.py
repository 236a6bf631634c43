"""One zoo training run, eager or lazy, with the lazy_mlir metrics of each phase.

Phases of a lazy run (``WARMUP`` steps, one more step of the same shape,
a ragged batch, a batch at the other length):
  warmup  the first steps compile (step 0 and 1 trace other graphs: the
          running loss starts from a Python float)
  steady  a step of a shape already seen: must compile nothing
  ragged  a smaller batch (an epoch's last): a new shape, may compile
  length  the model's other sequence length (image size): may compile
  third   a third length (where the spec has one): the second's
          shape-generic code serves it
Each phase's snapshot is taken after ``metrics.reset()`` at its start, so
it counts only that phase's mark_steps, executions and compiles.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

import lazy_mlir
from lazy_mlir.observe import metrics
import zoo

WARMUP = 2
LAZY = torch.device("lazy")


@dataclass
class Run:
    losses: torch.Tensor
    params: dict[str, torch.Tensor]
    phases: dict[str, dict] = field(default_factory=dict)   # phase -> metrics.snapshot()
    reports: dict[str, str] = field(default_factory=dict)   # phase -> metrics.report()
    first_step_s: float = 0.0
    running_loss: float = 0.0  # the losses summed on the device, as HF's Trainer does


def train(v: zoo.Variant, device: torch.device, dtype=torch.float64, perturb: float = 0.0,
          shapes: bool = True, capture: bool = False) -> Run:
    """``perturb`` scales the initial weights by 1 + perturb (a noise floor);
    ``shapes=False`` leaves out the ragged and other-length steps (each is a
    new graph to compile: most of a run's cold time); ``capture``: the model
    under lazy_mlir.capture."""
    spec = zoo.SPECS[v.model]
    model = zoo.make_model(v, dtype)
    if capture:
        lazy_mlir.capture(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + perturb)
    model = model.to(device)
    model.train()
    opt = spec.optimizer(model)
    data = zoo.batches(v, WARMUP + 1, dtype)[:None if shapes else WARMUP + 1]
    # The same seed before the first step in both runs: dropout draws from the
    # CPU generator in both (lazy bernoulli runs in the TorchScript glue graph).
    torch.manual_seed(1234)
    lazy = device.type == "lazy"
    phase_of = ["warmup"] * WARMUP + ["steady", "ragged", "length", "third"]
    losses, run = [], Run(None, {})
    # Summed on the device before mark_step from a Python float, as HF's
    # Trainer sums tr_loss: step 0 traces `loss + 0.0`, later steps `running
    # + loss`. Kept in the glue graph (graph_clusterer.h): no group compiles.
    running = 0.0
    for i, batch in enumerate(data):
        if lazy and (i == 0 or phase_of[i] != phase_of[i - 1]):
            metrics.reset()
        start = time.perf_counter()
        loss = spec.loss(model, *(t.to(device) for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        running = running + loss.detach()
        if lazy:
            torch._lazy.mark_step()
        losses.append(loss.item())  # after mark_step: reads data, runs no graph
        if i == 0:
            run.first_step_s = time.perf_counter() - start
        if lazy and (i + 1 == len(data) or phase_of[i + 1] != phase_of[i]):
            # a compile the phase started in the background (a new length's
            # shape-generic code) is the phase's: counted before it ends
            lazy_mlir.wait_for_compiles()
            run.phases[phase_of[i]] = metrics.snapshot()
            run.reports[phase_of[i]] = metrics.report()
    with torch.no_grad():  # p.detach() would trace a detach_copy and run a graph per parameter
        run.params = {n: p.cpu() for n, p in model.named_parameters()}
    run.losses = torch.tensor(losses, dtype=torch.float64)
    run.running_loss = float(running)  # data after the last mark_step: runs no graph
    return run
