"""The C++ backend's compile hook: one fusion group subgraph -> executable.

The executable lowers the group through MLIR when it first runs (its inputs
fix shapes); any failure there is reported (a warning naming the group's ops
and source lines, and the metrics) and the group runs in TorchScript: a
failed compile never loses a step. At O2 a failure is an error.
Returning ``None`` here makes the backend inline the group back at once.
"""
from __future__ import annotations

import collections

import torch

from .. import config
from ..cluster import compilable
from ..observe import metrics, syncs
from .executables import GroupExecutable, TorchScriptExecutable, report_failure

# Test seam: called with (graph, name) first; raise to inject a failure.
before_build = None


def describe_ops(graph: torch._C.Graph, max_sources: int = 3) -> str:
    """'aten::mm x2, aten::gelu from model.py:12 (forward), train.py:40 (step)'"""
    counts = collections.Counter()
    sources = collections.Counter()
    for node in graph.nodes():
        if node.kind() in compilable.PLUMBING_KINDS:
            continue
        counts[node.kind()] += 1
        if node.hasAttribute("source"):
            sources[node.s("source")] += 1
    ops = ", ".join(kind + (f" x{n}" if n > 1 else "") for kind, n in counts.most_common())
    where = ", ".join(syncs.short_source(s) for s, _ in sources.most_common(max_sources))
    return ops + (f" from {where}" if where else "")


# Ops that only copy their input: a group of one of them would compile to
# the copy TorchScript already runs (checkpoints' and ZeRO's per-tensor
# detaches compiled a group per tensor shape).
COPY_KINDS = {"aten::detach_copy", "aten::alias_copy", "aten::clone", "aten::_to_copy", "aten::view_copy",
              "aten::t_copy", "aten::permute_copy", "aten::expand_copy", "aten::slice_copy", "aten::select_copy"}


def compile_group(graph: torch._C.Graph, name: str):
    if compilable.is_settling():  # a setup graph of in-place mul_(1): nothing worth compiling
        return TorchScriptExecutable(graph, name, count=None)
    kinds = [n.kind() for n in graph.nodes() if n.kind() not in compilable.PLUMBING_KINDS]
    if len(kinds) == 1 and kinds[0] in COPY_KINDS and config.current.level != "O2":
        return None  # inlined back into the graph: it runs in TorchScript, counted as a group left there
    ops = describe_ops(graph)
    try:
        if before_build is not None:
            before_build(graph, name)
        metrics.record_group(name, len(kinds))
        return GroupExecutable(graph, name, config.current, ops, len(kinds))
    except Exception as exc:  # noqa: BLE001 - every failure falls back to TorchScript
        report_failure(name, ops, exc)
        return None
