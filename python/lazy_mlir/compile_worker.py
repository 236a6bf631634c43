"""The worker process of ``parallel_compile``: generates Inductor code for
fusion groups beside the process that traces the step (Inductor's compile
is mostly Python, which threads of one process would run one at a time
under the GIL).

It gets a group as the parent prepared it (the FX graph exported after the
MLIR passes, as ``portable_graph`` bytes, and the layouts of its inputs) and
sends back Inductor's serialized artefact, which
``group_lowering.adopt_code`` loads. Started as
``python -m lazy_mlir.compile_worker JOBS_FD REPLIES_FD``; the package never
imports this module.
"""
from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Connection

import torch


def blank_input(layout: tuple) -> torch.Tensor:
    """A tensor of the layout ``parallel_compile.input_layout`` describes."""
    shape, stride, offset, dtype, device = layout
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    return torch.empty(offset + extent, dtype=dtype, device=device).as_strided(shape, stride, offset)


def _serve(jobs: Connection, replies: Connection) -> None:
    # One core each: this process and the one it serves take the others.
    torch._inductor.config.compile_threads = 1
    # The parent compiles the step's largest group, which the step waits for
    # longest: on a busy machine the worker takes what the parent leaves.
    os.nice(10)
    from . import portable_graph
    from .codegen import inductor
    from .group_lowering import fake_inputs_of
    replies.send(("ready",))
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            return
        start = time.perf_counter()
        try:
            gm = portable_graph.loads(job["graph"])
            fake_mode, fakes = fake_inputs_of([blank_input(layout) for layout in job["inputs"]])
            _, _, artefact = inductor.compile_graph(gm, fakes, fake_mode, job["name"], serializable=True,
                                                    cpp_wrapper=job.get("cpp_wrapper", False))
            if artefact is None:
                raise RuntimeError("Inductor gave no serializable artefact")
            reply = ("done", artefact, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - the parent generates this group's code itself
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        replies.send(reply)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
