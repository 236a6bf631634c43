"""Executables bound into CompiledGroup: callables list[Tensor] -> list[Tensor].

GroupExecutable lowers its group through MLIR at the group's first run (the
inputs fix shapes and dtypes; LTC keys graphs by shape, so they do not
change) and from then on calls the generated code directly.
TorchScriptExecutable runs the group's own TorchScript subgraph: the
fallback for a group that fails to lower at O1.
"""
from __future__ import annotations

import sys
import time
import warnings

import torch

from . import compile_cache, config, metrics
from .group_lowering import lower_group


class TorchScriptExecutable:
    """Runs a fusion group's subgraph with the TorchScript graph executor."""

    def __init__(self, graph: torch._C.Graph, name: str):
        graph = graph.copy()
        outputs = list(graph.outputs())
        self.num_outputs = len(outputs)
        if self.num_outputs != 1:
            # A TorchScript function returns one value: pack several in a tuple.
            for _ in outputs:
                graph.eraseOutput(0)
            tup = graph.create("prim::TupleConstruct", outputs)
            tup.output().setType(torch._C.TupleType([v.type() for v in outputs]))
            tup.insertBefore(graph.return_node())
            graph.registerOutput(tup.output())
        self.function = torch._C._create_function_from_graph(name.replace(".", "_"), graph)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = self.function(*inputs)
        return [out] if self.num_outputs == 1 else list(out)


class GroupLoweringError(RuntimeError):
    pass


def report_failure(name: str, describe: str, exc: Exception) -> None:
    """A group that failed to compile and runs in TorchScript: metrics and a warning."""
    reason = f"{type(exc).__name__}: {exc}"
    metrics.record_group_failure(name, describe, reason)
    warnings.warn(f"lazy_mlir: fusion group {name} [{describe}] failed to compile ({reason}); "
                  "it runs in TorchScript instead", RuntimeWarning, stacklevel=1)


class GroupExecutable:
    def __init__(self, graph: torch._C.Graph, name: str, cfg: config.Config, describe: str, num_ops: int):
        self.graph = graph.copy()
        self.name = name
        self.num_ops = num_ops
        self.cfg = cfg
        self.describe = describe  # the group's ops and source lines, for messages
        self.cache_key = None
        self._run = self._first_run

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._run(inputs)

    def _first_run(self, inputs):
        self.cache_key = compile_cache.group_key(self.graph, inputs, self.cfg.key())
        self._use(self._lowered_for(inputs))
        return self._run(inputs)

    def _use(self, lowered):
        self.lowered = lowered
        if lowered is None:
            self._run = TorchScriptExecutable(self.graph, self.name)
        elif lowered.guards or lowered.collective_bytes:
            self._run = self._checked
        else:
            self._run = lowered.run  # the hot path: straight into the generated code

    def _checked(self, inputs):
        if any(inputs[i].item() != value for i, value in self.lowered.guards):
            # A scalar whose value was baked in (a shape depends on it) changed.
            self._use(self._lowered_for(inputs))
            return self._run(inputs)
        if self.lowered.collective_bytes:
            metrics.count_collectives(self.lowered.collective_bytes)
        return self.lowered.run(inputs)

    def _lowered_for(self, inputs):
        lowered = compile_cache.lookup(self.cache_key, inputs)
        if lowered is not None:
            return lowered
        start = time.perf_counter()
        if self.cfg.progress:
            print(f"lazy_mlir: compiling {self.name} ({self.num_ops} ops) ...", file=sys.stderr, flush=True)
        try:
            lowered = lower_group(self.graph, inputs, self.name, self.cfg)
        except Exception as exc:  # noqa: BLE001 - O1 falls back to TorchScript, O2 fails
            if self.cfg.level == "O2":
                metrics.record_group_failure(self.name, self.describe, f"{type(exc).__name__}: {exc}")
                raise GroupLoweringError(f"lazy_mlir O2: the step failed to compile ({type(exc).__name__}: {exc}); "
                                         f"group ops: {self.describe}. Use level=\"O1\" to run such groups in "
                                         "TorchScript.") from exc
            report_failure(self.name, self.describe, exc)
            return None
        if self.cfg.progress:
            print(f"lazy_mlir: compiled {self.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        compile_cache.store(self.cache_key, lowered)
        return lowered
