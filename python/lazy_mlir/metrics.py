"""What lazy_mlir did: traces, compiles, cache hits, executions, fallbacks.

``snapshot()`` merges three sources: LTC's own counters (mark steps, graph
cache hits and misses, its eager-fallback counters ``aten::*``), the C++
backend's run statistics, and what the Python side recorded (group builds,
fallbacks of ops our decompositions could not trace). ``reset()`` clears
all three, so a snapshot after ``reset()`` describes the steps since.
"""
from __future__ import annotations

import collections
import threading

import torch._lazy.metrics as ltc_metrics

_lock = threading.Lock()
_fallbacks: collections.Counter = collections.Counter()
_groups: dict[str, int] = {}          # group name -> op count
_group_failures: dict[str, str] = {}  # group name -> reason
_stage_seconds: collections.Counter = collections.Counter()
_group_cache: collections.Counter = collections.Counter()  # "hit" / "miss"
_collective_bytes: collections.Counter = collections.Counter()  # "all_gather" ... -> bytes moved

# LTC counters that are syncs the user asked for, not fallbacks.
_USER_SYNCS = {"aten::_local_scalar_dense"}


def count_fallback(op_name: str) -> None:
    with _lock:
        _fallbacks[op_name] += 1


def record_group(name: str, num_ops: int) -> None:
    """A fusion group bound into a graph (it compiles at its first run)."""
    with _lock:
        _groups[name] = num_ops


def record_stage(stage: str, seconds: float) -> None:
    with _lock:
        _stage_seconds[stage] += seconds


def count_cache(outcome: str) -> None:
    with _lock:
        _group_cache[outcome] += 1


def count_collectives(per_run: dict[str, int]) -> None:
    """Called per run of a compiled group with the bytes its collectives move."""
    with _lock:
        _collective_bytes.update(per_run)


def collective_bytes() -> dict[str, int]:
    with _lock:
        return dict(_collective_bytes)


def reset_collective_bytes() -> None:
    with _lock:
        _collective_bytes.clear()


def record_group_failure(name: str, ops: str, reason: str) -> None:
    with _lock:
        _group_failures[name] = f"[{ops}] {reason}"


def _backend_stats() -> dict:
    from . import _C
    return dict(_C.stats())


def _ltc_counter(name: str) -> int:
    return int(ltc_metrics.counter_value(name) or 0)


def snapshot() -> dict:
    stats = _backend_stats()
    fallbacks = collections.Counter()
    for name in ltc_metrics.counter_names():
        if name.startswith("aten::") and name not in _USER_SYNCS:
            fallbacks[name] += _ltc_counter(name)
    with _lock:
        fallbacks.update(_fallbacks)
        groups_per_graph = collections.Counter(g.split(".")[0] for g in _groups)
        failures = dict(_group_failures)
        stages = dict(_stage_seconds)
        group_cache = dict(_group_cache)
    mark_steps = _ltc_counter("MarkStep")
    uncached, cached = _ltc_counter("UncachedCompile"), _ltc_counter("CachedCompile")
    return {
        "mark_steps": mark_steps,
        "traces": uncached + cached,
        "compiles": stats["compiles"],
        "cache_hits": cached,
        "cache_misses": uncached,
        "graph_executions": stats["executions"],
        "executions_per_mark_step": stats["executions"] / mark_steps if mark_steps else 0.0,
        "fallbacks": dict(fallbacks),
        "fallback_count": sum(fallbacks.values()),
        "user_syncs": sum(_ltc_counter(n) for n in _USER_SYNCS),
        "groups_built": stats["groups_built"],
        "groups_rejected": stats["groups_rejected"],
        "groups_per_graph": dict(groups_per_graph),
        "group_failures": failures,
        "group_calls": stats["group_calls"],
        "collective_bytes": collective_bytes(),
        "group_cache_hits": group_cache.get("hit", 0),
        "group_cache_misses": group_cache.get("miss", 0),
        "seconds": {
            "compile": stats["compile_ns"] / 1e9,
            "group_build": sum(stages.values()),
            "execute": stats["execute_ns"] / 1e9,
            "group_run": stats["group_ns"] / 1e9,
            **{f"stage.{k}": v for k, v in stages.items()},
        },
    }


def reset() -> None:
    from . import _C
    ltc_metrics.reset()
    _C.reset_stats()
    with _lock:
        _fallbacks.clear()
        _groups.clear()
        _group_failures.clear()
        _stage_seconds.clear()
        _group_cache.clear()
        _collective_bytes.clear()


def report() -> str:
    s = snapshot()
    lines = [
        "lazy_mlir metrics",
        f"  mark_steps           {s['mark_steps']}",
        f"  traces               {s['traces']}  (graph cache hits {s['cache_hits']}, misses {s['cache_misses']})",
        f"  compiles             {s['compiles']}",
        f"  graph executions     {s['graph_executions']}  ({s['executions_per_mark_step']:.2f} per mark_step)",
        f"  fusion groups        {s['groups_built']} built, {s['groups_rejected']} left to TorchScript",
        f"  group calls          {s['group_calls']}",
        f"  group cache          {s['group_cache_hits']} hits, {s['group_cache_misses']} misses",
    ]
    if s["groups_per_graph"]:
        per = ", ".join(f"{g}: {n}" for g, n in sorted(s["groups_per_graph"].items()))
        lines.append(f"  groups per graph     {per}")
    lines.append(f"  fallbacks            {s['fallback_count']}")
    for op, n in sorted(s["fallbacks"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {op:<30} {n}")
    for name, why in s["group_failures"].items():
        lines.append(f"  failed group {name}: {why}")
    lines.append("  seconds              " + ", ".join(f"{k} {v:.3f}" for k, v in s["seconds"].items()))
    return "\n".join(lines)
