"""A group's whole compile in a worker process (``Config.isolated_compile``).

Compiling a group loads torch-mlir's MLIR libraries and Inductor's compiler
(~100 MB that stay in a process once imported) and leaves the heap the
compile used behind: most of lazy_mlir's peak memory above eager's. Here
the group goes to a ``compile_worker`` process instead, as its TorchScript
graph (IR text plus the constants' values, which the text does not carry
exactly); the worker lowers it (MLIR passes and all), generates Inductor's
C++-wrapped code, runs it once on blank inputs to plan the native call
(native_call.probe) and sends back Inductor's artefact and that plan. This
process calls the library from C++; Python loads the artefact only for a
run C++ does not take (lowered_group.LoadOnFirstCall).

A graph's several groups (``parallel_compile``) go in two steps: each is
lowered to FX in the worker during the graph's first execution
(``prepare``: the strides of its outputs), and its code is generated at the
flush (``generate``, or in a second worker), then adopted here without the
lowering (``adopt``).

It takes static CPU groups compiled with the C++ wrapper (the native call
needs it), without dumps (the dumps are written by the process that runs
the stages) and outside distributed runs (collectives keep the Python
wrapper). Anything the worker cannot do (a graph that does not survive the
trip, a worker that does not start or dies, a whole compile without a
native plan, an error of the compile itself) is done here as before, whose
errors are reported as always.
"""
from __future__ import annotations

import atexit
import dataclasses
import pickle
import sys
import threading
import time

import torch

from .. import config
from ..cache import group_key
from ..lowering.lowered_group import LoadOnFirstCall, LoweredGroup
from ..observe import metrics
from . import parallel

# The worker stays this long after its last compile (a graph's compiles come
# together; a later recompile then skips its ~5 s start), then ends.
IDLE_SECONDS = 60.0

_lock = threading.Lock()
_worker = None  # parallel.WorkerProcess
_idle_timer: threading.Timer | None = None


def applies(cfg: config.Config, inputs: list[torch.Tensor]) -> bool:
    if not (cfg.isolated_compile and cfg.cpp_wrapper and cfg.native_calls) or cfg.codegen != "inductor":
        return False
    if cfg.dump_dir or not all(t.device.type == "cpu" for t in inputs):
        return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


def graph_message(graph: torch._C.Graph) -> dict:
    """The graph as the worker rebuilds it: its IR text, and the value of each
    constant the text prints inexactly (a tensor's data, a bool list's
    bools), by the constant's ordinal. Tensor constants are printed as a
    0-d placeholder (the parser takes no tensor of several elements)."""
    graph = graph.copy()
    constants = {}
    for k, node in enumerate(n for n in graph.nodes() if n.kind() == "prim::Constant"):
        if node.hasAttribute("value") and node.kindOf("value") in ("t", "ival"):
            value = node.output().toIValue()
            if isinstance(value, torch.Tensor):
                value = value.detach().clone()
                node.t_("value", torch.zeros((), dtype=value.dtype))
            constants[k] = (node.kindOf("value"), value)
    return {"ir": str(graph), "constants": constants}


def graph_from_message(message: dict) -> torch._C.Graph:
    graph = torch._C.parse_ir(message["ir"], parse_tensor_constants=True)
    for k, node in enumerate([n for n in graph.nodes() if n.kind() == "prim::Constant"]):
        if k not in message["constants"]:
            continue
        kind, value = message["constants"][k]
        if kind == "t":
            node.t_("value", value)
        elif repr(node.ival("value")) != repr(value):  # [True] parses as [1] (an empty list parses exact)
            node.ival_("value", value)
    return graph


def input_message(inputs: list[torch.Tensor]) -> dict:
    """What the worker makes blank inputs from: layouts, which earlier input
    each repeats (LTC passes one tensor twice), and the 0-d inputs' values
    (the passes bake some into the code, and the code the worker runs once
    may compute an index from one: Funnel's position gather read out of
    bounds on zeros, which ended the worker)."""
    first: dict[int, int] = {}
    return {"layouts": [parallel.input_layout(t) for t in inputs],
            "same_as": [first.setdefault(id(t), i) for i, t in enumerate(inputs)],
            "scalars": {i: t.item() for i, t in enumerate(inputs) if t.dim() == 0}}


def lower(graph: torch._C.Graph, inputs: list[torch.Tensor], name: str, cfg: config.Config) -> LoweredGroup | None:
    """The group compiled in the worker, or None: compile it here."""
    start = time.perf_counter()
    reply = _ask(_group_job("lower", graph, inputs, name, cfg), name, cfg)
    if reply is None:
        return None
    result = reply[1]
    metrics.record_stage("isolated_compile", time.perf_counter() - start)
    return _adopted(result["artifacts"]["inductor"], result["plan"], result["guards"], result["collective_bytes"],
                    result["artifacts"], cfg)


@dataclasses.dataclass
class PreparedElsewhere:
    """A deferred compile's group lowered to FX in the worker
    (``parallel_compile``): what its flush and the group need of it."""
    strides: list          # of the outputs the code will return
    guards: list
    collective_bytes: dict
    artifacts: dict        # {"graph": the exported graph's bytes, ...}

    def output_strides(self) -> list:
        return self.strides


def prepare(graph: torch._C.Graph, inputs: list[torch.Tensor], name: str,
            cfg: config.Config) -> PreparedElsewhere | None:
    """The group lowered to FX in the worker, or None: prepare it here."""
    start = time.perf_counter()
    reply = _ask(_group_job("prepare", graph, inputs, name, cfg), name, cfg)
    if reply is None:
        return None
    metrics.record_stage("isolated_prepare", time.perf_counter() - start)
    return PreparedElsewhere(**reply[1])


def generate(name: str, prepared: PreparedElsewhere, inputs: list[torch.Tensor], cfg: config.Config):
    """(Inductor's artefact, native plan or None) of a prepared group,
    generated in the worker; None: generate it here."""
    job = {"name": name, "graph": prepared.artifacts["graph"], "inputs": input_message(inputs),
           "cpp_wrapper": True, "probe": True}
    reply = _ask(job, name, cfg, expected="done")
    return None if reply is None else (reply[1], reply[3])


def adopt(prepared: PreparedElsewhere, artefact: bytes, plan, cfg: config.Config) -> LoweredGroup:
    """The group with code a worker generated: called natively with ``plan``,
    Inductor's artefact loaded only for a run C++ does not take; without a
    plan (code C++ cannot call) loaded at its first run, which probes it
    again. Neither loads the lowering or MLIR."""
    return _adopted(artefact, plan, prepared.guards, prepared.collective_bytes, prepared.artifacts, cfg)


def _adopted(artefact: bytes, plan, guards: list, collective_bytes: dict, artifacts: dict,
             cfg: config.Config) -> LoweredGroup:
    stored = dict(artifacts, inductor=artefact if cfg.cache_inductor else None) if cfg.cache else None
    return LoweredGroup(LoadOnFirstCall(lambda _inputs: _load_artefact(artefact)), guards, collective_bytes, stored,
                        native=plan)


def _group_job(kind: str, graph: torch._C.Graph, inputs: list[torch.Tensor], name: str, cfg: config.Config) -> dict:
    # Pickled here: the connection's own pickler would send tensors through
    # shared memory (torch.multiprocessing's reductions), which needs an authkey.
    return {"kind": kind, "payload": pickle.dumps({
        "name": name, "graph": graph_message(graph), "structure": group_key.structure(graph),
        "inputs": input_message(inputs), "cfg": cfg})}


def _ask(job: dict, name: str, cfg: config.Config, expected: str | None = None) -> tuple | None:
    """The worker's reply to ``job`` (its kind, or ``expected``); None (counted,
    and said with progress on) when the worker could not do it."""
    with _lock:
        worker = _started_worker()
        reply = worker.send(job) if worker is not None else ("failed", "the compile worker did not start")
        _stop_when_idle()
    if reply[0] == (expected or {"lower": "lowered", "prepare": "prepared"}[job["kind"]]):
        return reply
    metrics.count_cache("isolated_failed")
    if cfg.progress:
        print(f"lazy_mlir: {name}: the compile worker cannot take it ({reply[1]}); compiling it here",
              file=sys.stderr, flush=True)
    return None


def _load_artefact(artefact: bytes):
    from ..codegen import inductor  # here: a run C++ does not take is the only one that loads Inductor
    return inductor.load_artefact(artefact)


def _started_worker():
    global _worker
    if _worker is not None and _worker.alive:
        return _worker
    if _worker is not None:  # it died: its pipes go with it
        _worker.stop()
        _worker.close()
    _worker = parallel.WorkerProcess()
    if not _worker.wait_ready():
        _worker.stop()
        _worker.close()
        _worker = None
    return _worker


def _stop_when_idle() -> None:
    global _idle_timer
    if _idle_timer is not None:
        _idle_timer.cancel()
    _idle_timer = threading.Timer(IDLE_SECONDS, stop)
    _idle_timer.daemon = True
    _idle_timer.start()


def stop() -> None:
    """Ends the worker (idle, or at exit)."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.stop()
            _worker.close()
            _worker = None


atexit.register(stop)
