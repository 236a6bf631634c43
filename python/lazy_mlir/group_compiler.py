"""The C++ backend's compile hook: one fusion group subgraph -> executable.

Any failure here is reported (warning naming the group's ops and their
source lines, and the metrics) and answered with ``None``, which makes the
backend inline the group back into the TorchScript glue graph: a failed
compile never loses a step. At O2 the backend turns ``None`` into an error.
"""
from __future__ import annotations

import collections
import time
import warnings

import torch

from . import compilable, dump, metrics
from .executables import TorchScriptExecutable

# Test seam: called with (graph, name) before building; raise to inject a failure.
before_build = None


def describe_ops(graph: torch._C.Graph, limit: int = 8) -> str:
    """'aten::addmm x2, aten::gelu (at model.py forward 12), ...'"""
    counts = collections.Counter()
    where = {}
    for node in graph.nodes():
        kind = node.kind()
        if kind in compilable.PLUMBING_KINDS:
            continue
        counts[kind] += 1
        if kind not in where and node.hasAttribute("source"):
            where[kind] = node.s("source")
    parts = []
    for kind, n in counts.most_common(limit):
        text = kind + (f" x{n}" if n > 1 else "")
        parts.append(text + (f" (at {where[kind]})" if kind in where else ""))
    if len(counts) > limit:
        parts.append(f"... {len(counts) - limit} more kinds")
    return ", ".join(parts)


def compile_group(graph: torch._C.Graph, name: str):
    start = time.perf_counter()
    try:
        if before_build is not None:
            before_build(graph, name)
        dump.write(name, "ts.txt", str(graph))
        executable = TorchScriptExecutable(graph, name)
    except Exception as exc:  # noqa: BLE001 - every failure falls back to TorchScript
        ops = describe_ops(graph)
        metrics.record_group_failure(name, ops, f"{type(exc).__name__}: {exc}")
        warnings.warn(f"lazy_mlir: fusion group {name} [{ops}] failed to compile "
                      f"({type(exc).__name__}: {exc}); it runs in TorchScript instead",
                      RuntimeWarning, stacklevel=1)
        return None
    metrics.record_group(name, sum(1 for n in graph.nodes() if n.kind() not in compilable.PLUMBING_KINDS),
                         time.perf_counter() - start)
    return executable
