"""Route DEFERRED (``routes``): a group's static compile left to the end of
its graph's first execution, where ``parallel`` generates it beside the
graph's other groups (in worker processes, or here).
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import Future

import torch

from ..cache import compile_cache
from ..lowering import lowering_function
from ..observe import metrics
from . import isolated

prepare_group = lowering_function("prepare_group")
generate_code = lowering_function("generate_code")
adopt_code = lowering_function("adopt_code")


class DeferredCompile:
    """A group's static compile left to its graph's flush (route DEFERRED, ``routes``):
    ``prepare`` (TS to exported FX, in the step), then at the flush
    ``generate`` here or a worker's artefact, and ``finish`` hands the code
    to the group. A follower (a group alike to one deferred before it) takes
    its leader's code from the cache."""

    def __init__(self, executable, inputs: list[torch.Tensor]):
        self.executable, self.inputs = executable, inputs
        self.cfg, self.key = executable.cfg, executable.cache_key
        self.name, self.num_ops = executable.name, executable.num_ops
        self.future: Future | None = None
        self.prepared = self.lowered = self.output_strides = None
        self.leader: DeferredCompile | None = None
        self.artefact, self.worker_seconds, self.worker_failure = None, 0.0, None
        self.plan = None  # the native call's, when a worker ran the code (``isolated``)

    def prepare(self) -> bool:
        """Lowers the group to FX, in the compile worker where ``isolated``
        applies (False: that failed, reported)."""
        if isolated.applies(self.cfg, self.inputs):
            self.prepared = isolated.prepare(self.executable.graph, self.inputs, self.name, self.cfg)
        if self.prepared is None:
            try:
                self.prepared = prepare_group(self.executable.graph, self.inputs, self.name, self.cfg,
                                              keep_graph=True)
            except Exception as exc:  # noqa: BLE001 - O1 runs it in TorchScript
                self.executable.compile_failed(exc)
                return False
        self.output_strides = self.prepared.output_strides()  # Inductor's (parallel.applies)
        return True

    @property
    def isolated(self) -> bool:
        """Prepared in the compile worker: its code is generated and planned in workers too."""
        return isinstance(self.prepared, isolated.PreparedElsewhere)

    def follow(self, leader: DeferredCompile) -> None:
        self.leader, self.output_strides = leader, leader.output_strides

    @property
    def portable(self) -> bool:
        """Whether a worker can take it: its exported graph kept as bytes."""
        return self.prepared is not None and self.prepared.artifacts is not None

    def request(self) -> tuple:
        artifacts = self.prepared.artifacts
        return (self.name, artifacts["graph"], isolated.input_message(self.inputs),
                artifacts.get("cpp_wrapper", False), self.isolated)

    def generated_elsewhere(self, artefact: bytes, seconds: float, plan=None) -> None:
        """A worker's code for it, and its native plan when asked for
        (loaded by ``finish``)."""
        self.artefact, self.worker_seconds, self.plan = artefact, seconds, plan
        if self.cfg.progress:
            print(f"lazy_mlir: compiled {self.name} ({self.num_ops} ops) in {seconds:.1f} s in a compile worker",
                  file=sys.stderr, flush=True)

    def generate(self) -> None:
        """Its code, generated in this process, or in the compile worker for a
        group prepared there (``isolated``)."""
        if self.worker_failure and self.cfg.progress:
            print(f"lazy_mlir: {self.name}: the compile worker failed it ({self.worker_failure}); compiling it here",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        if self.isolated and self.worker_failure is None:
            generated = isolated.generate(self.name, self.prepared, self.inputs, self.cfg)
            if generated is not None:
                self.lowered = isolated.adopt(self.prepared, *generated, self.cfg)
                if self.cfg.progress:
                    print(f"lazy_mlir: compiled {self.name} ({self.num_ops} ops) in {time.perf_counter() - start:.1f} "
                          "s in the compile worker", file=sys.stderr, flush=True)
                return
        try:
            if self.isolated:  # the worker could not: lowered here after all
                self.prepared = prepare_group(self.executable.graph, self.inputs, self.name, self.cfg,
                                              keep_graph=True)
            self.lowered = generate_code(self.prepared, self.cfg)
        except Exception as exc:  # noqa: BLE001 - O1 runs it in TorchScript
            self.executable.compile_failed(exc)
            return
        if self.cfg.progress:
            print(f"lazy_mlir: compiled {self.name} ({self.num_ops} ops) in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)

    def finish(self) -> None:
        ex = self.executable
        if self.artefact is not None:
            try:
                if self.isolated:
                    self.lowered = isolated.adopt(self.prepared, self.artefact, self.plan, self.cfg)
                else:
                    self.lowered = adopt_code(self.prepared, self.artefact, self.cfg)
                metrics.record_worker_compile(self.worker_seconds)
            except Exception as exc:  # noqa: BLE001 - generated here instead
                self.worker_failure = f"its code does not load here: {type(exc).__name__}: {exc}"
                self.generate()
        elif self.leader is not None:
            # the leader's code, or its failure; else (another guard value) its own compile
            self.lowered = ex.cached(self.inputs, count_miss=False)
            if self.lowered is None and not ex.failed_before() and self.prepare():
                self.generate()
        if self.lowered is not None:
            if self.prepared is not None:
                compile_cache.store(self.key, self.lowered, self.cfg)
            ex.add_variant(self.inputs, self.lowered.guards)
        self.future.set_result(self.lowered)
