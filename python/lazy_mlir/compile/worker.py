"""The worker process of ``parallel_compile``: generates Inductor code for
fusion groups beside the process that traces the step (Inductor's compile
is mostly Python, which threads of one process would run one at a time
under the GIL).

It gets a group as the parent prepared it (the FX graph exported after the
MLIR passes, as ``portable_graph`` bytes, and the layouts of its inputs) and
sends back Inductor's serialized artefact, which
``group_lowering.adopt_code`` loads; or (``isolated_compile``) the group's
TorchScript graph, which it compiles whole, sending back the artefact and
the plan of the native call. Started as
``python -m lazy_mlir.compile.worker JOBS_FD REPLIES_FD``; the package never
imports this module.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection

import torch


def blank_input(layout: tuple) -> torch.Tensor:
    """A tensor of the layout ``parallel.input_layout`` describes."""
    shape, stride, offset, dtype, device = layout
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    return torch.empty(offset + extent, dtype=dtype, device=device).as_strided(shape, stride, offset)


def _serve(jobs: Connection, replies: Connection) -> None:
    # One core each: this process and the one it serves take the others.
    torch._inductor.config.compile_threads = 1
    # The parent compiles the step's largest group, which the step waits for
    # longest: on a busy machine the worker takes what the parent leaves.
    os.nice(10)
    # the compiler, imported once the settings above are made
    from ..lowering import portable_graph
    from ..codegen import inductor
    from ..lowering.group_lowering import fake_inputs_of
    replies.send(("ready",))
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            return
        if job.get("kind") in ("lower", "prepare"):
            replies.send(_lower(job))
            continue
        start = time.perf_counter()
        try:
            gm = portable_graph.loads(job["graph"])
            blanks = _blank_inputs(job["inputs"], aliased=False)  # the graph's code: compiled for separate buffers
            fake_mode, fakes = fake_inputs_of(blanks)
            run, _, artefact = inductor.compile_graph(gm, fakes, fake_mode, job["name"], serializable=True,
                                                      cpp_wrapper=job.get("cpp_wrapper", False))
            if artefact is None:
                raise RuntimeError("Inductor gave no serializable artefact")
            reply = ("done", artefact, time.perf_counter() - start, _plan(run, blanks) if job.get("probe") else None)
        except Exception as exc:  # noqa: BLE001 - the parent generates this group's code itself
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        replies.send(reply)


def _blank_inputs(message: dict, aliased: bool = True) -> list[torch.Tensor]:
    """Zeros (an index into anything), laid out (and ``aliased``) as the
    parent's inputs, the 0-d ones holding its values."""
    inputs = []
    for i, (layout, same_as) in enumerate(zip(message["layouts"], message["same_as"])):
        t = inputs[same_as] if aliased and same_as != i else blank_input(layout).zero_()
        if i in message["scalars"]:
            t.fill_(message["scalars"][i])
        inputs.append(t)
    return inputs


def _plan(run, inputs: list[torch.Tensor]):
    """The native plan of code run once on ``inputs`` (zeros); None when it
    does not run on them or cannot be called natively."""
    from ..codegen import native_call
    try:
        return native_call.probe(run, inputs)[1]
    except Exception:  # noqa: BLE001 - the parent probes it itself
        return None


def _lower(job: dict) -> tuple:
    """A group's whole compile ("lowered", result) or its lowering to FX
    ("prepared", result); ("failed", why): the parent does it."""
    # the lowering, imported after _serve's settings, as the compiler above
    from ..cache import group_key
    from ..lowering import fused_optimizer  # noqa: F401 - defines lazy_mlir::adam_step and sgd_step
    from . import isolated
    from ..lowering.group_lowering import generate_code, prepare_group
    kind, job = job["kind"], pickle.loads(job["payload"])
    try:
        graph = isolated.graph_from_message(job["graph"])
    except Exception as exc:  # noqa: BLE001 - the parent has the graph itself
        return ("failed", f"its IR does not parse here: {type(exc).__name__}: {exc}")
    if group_key.structure(graph) != job["structure"]:
        return ("failed", "its graph changed on the way")
    cfg = dataclasses.replace(job["cfg"], cache=True, cache_inductor=True)  # the artefact goes back
    inputs = _blank_inputs(job["inputs"])
    try:
        prepared = prepare_group(graph, inputs, job["name"], cfg, keep_graph=True)
        if kind == "prepare":
            if prepared.artifacts is None:
                return ("failed", "its exported graph cannot be sent")
            return ("prepared", {"strides": prepared.output_strides(), "guards": prepared.guards,
                                 "collective_bytes": prepared.collective_bytes, "artifacts": prepared.artifacts})
        lowered = generate_code(prepared, cfg)
    except Exception as exc:  # noqa: BLE001 - the parent's own compile reports the error
        return ("failed", f"{type(exc).__name__}: {exc}")
    if lowered.artifacts is None or lowered.artifacts.get("inductor") is None:
        return ("failed", "Inductor gave no serializable artefact")
    plan = _plan(lowered.run, inputs)
    if plan is None:
        return ("failed", "its code does not run on zeros, or cannot be called natively")
    return ("lowered", {"artifacts": lowered.artifacts, "guards": lowered.guards,
                        "collective_bytes": lowered.collective_bytes, "plan": plan})


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
