"""What lazy_mlir did: traces, compiles, cache hits, executions, fallbacks.

``snapshot()`` merges three sources: LTC's own counters (mark steps, graph
cache hits and misses, its eager-fallback counters ``aten::*``), the C++
backend's run statistics, and what the Python side recorded (group builds,
fallbacks of ops our decompositions could not trace). ``reset()`` clears
all three, so a snapshot after ``reset()`` describes the steps since.
"""
from __future__ import annotations

import collections
import contextlib
import threading

import torch._lazy.metrics as ltc_metrics

from ..native import _C

_lock = threading.Lock()
_fallbacks: collections.Counter = collections.Counter()
_fallback_sources: collections.Counter = collections.Counter()  # "op at file:line (fn)" -> count
_syncs: collections.Counter = collections.Counter()  # user source line -> graph executions outside mark_step
# Per-group records keep the most recent KEPT: a loop that meets new graphs
# for ever (new shapes, new code) holds no more.
KEPT = 1024
_groups: collections.OrderedDict = collections.OrderedDict()  # group name -> op count, oldest first
_failure_reasons: dict[str, str] = {}  # group name -> why it runs in TorchScript (kept across reset)
_fallen_back: dict[str, str] = {}      # groups that failed or ran in TorchScript since reset -> why
_fallback_group_calls = 0              # runs of such groups since reset
_interpreted_group_calls = 0           # runs in TorchScript while their code compiled (background, parallel_compile)
_worker_compiles = [0, 0.0]            # groups whose code a compile worker generated, and its seconds there
_stage_seconds: collections.Counter = collections.Counter()
_stage_runs: collections.Counter = collections.Counter()  # how often each stage ran
_group_cache: collections.Counter = collections.Counter()  # "hit" (memory) / "disk_hit" / "miss" / "wait"
_recompiles: collections.deque = collections.deque(maxlen=KEPT)  # recompiles.before_compile's explanations
_collective_bytes: collections.Counter = collections.Counter()  # "all_gather" ... -> bytes moved
_zero_schedule: dict = {}  # zero.schedule's measurements and decision (kept across reset)
_memory_budget: dict = {}  # trace.memory_budget's measurements and decision (kept across reset)
_optimizer_groups: collections.Counter = collections.Counter()  # fused_optimizer: None (fused) or why not
_captures: collections.Counter = collections.Counter()  # capture: "replayed" / "recorded" / "refused" calls
_capture_refusals: dict[str, str] = {}  # module class -> why its forward runs op by op
_checks: collections.Counter = collections.Counter()  # numerics_check: "passed" / "mismatched" first runs
_check_mismatches: dict[str, str] = {}  # group name -> the checker's report (kept across reset)
_cuda_graphs: collections.Counter = collections.Counter()  # cuda_graphs: "captured" / "replayed"
# group name -> why its code is not replayed as a CUDA graph (kept across reset:
# decided at a compile or a second run, before the steps a benchmark times)
_cuda_graph_refusals: dict[str, str] = {}
# What setup graphs (steady_state's) added to the backend's and LTC's counters:
# left out of the step figures, counted as "setup_graphs".
_setup: collections.Counter = collections.Counter()
_SETUP_LTC_COUNTERS = ("MarkStep", "UncachedCompile", "CachedCompile")

# LTC counts a view op's eager fallback before refusing it; lazy_kernels
# catches that refusal and traces the op another way: not a fallback.
_refused: collections.Counter = collections.Counter()


def count_fallback(op_name: str, source: str) -> None:
    with _lock:
        _fallbacks[op_name] += 1
        _fallback_sources[f"{op_name} at {source}"] += 1


def count_refused_fallback(op_name: str) -> None:
    """LTC counted ``op_name`` as an eager fallback but refused to run it
    (a view op); the caller recovered, so it is not reported as a fallback."""
    with _lock:
        _refused[op_name] += 1


def count_sync(source: str) -> None:
    with _lock:
        _syncs[source] += 1


def count_fallback_group_call(name: str) -> None:
    """A group that failed to compile ran its TorchScript subgraph."""
    global _fallback_group_calls
    with _lock:
        _fallback_group_calls += 1
        _fallen_back[name] = _failure_reasons.get(name, "failed to compile")


def count_interpreted_group_call(name: str) -> None:
    """A group ran its TorchScript subgraph while its code compiled: in the
    background, or beside its graph's other groups (parallel_compile)."""
    global _interpreted_group_calls
    with _lock:
        _interpreted_group_calls += 1


def record_group(name: str, num_ops: int) -> None:
    """A fusion group bound into a graph (it compiles at its first run)."""
    with _lock:
        _groups[name] = num_ops
        _groups.move_to_end(name)
        if len(_groups) > KEPT:
            _groups.popitem(last=False)


def record_worker_compile(seconds: float) -> None:
    """A group's code came from a compile worker, which took ``seconds``."""
    with _lock:
        _worker_compiles[0] += 1
        _worker_compiles[1] += seconds


def record_stage(stage: str, seconds: float) -> None:
    with _lock:
        _stage_seconds[stage] += seconds
        _stage_runs[stage] += 1


def record_recompile(record: dict) -> None:
    """A compile after a group's first: group, ops, step_source, previous, changes."""
    with _lock:
        _recompiles.append(record)


def format_recompile(record: dict) -> str:
    text = (f"{record['group']} [{record['ops']}], step at {record['step_source']}, "
            f"vs {record['previous']}: " + "; ".join(record["changes"]))
    return text + (f"; not shape-generic: {record['not_shape_generic']}" if "not_shape_generic" in record else "")


def count_optimizer_group(unfused_reason: str | None) -> None:
    """An Adam or SGD parameter group's step: traced as one node (None), or torch's
    own per-tensor ops, and why (see fused_optimizer)."""
    with _lock:
        _optimizer_groups[unfused_reason] += 1


def count_capture(outcome: str, module: str | None = None, why: str | None = None) -> None:
    """A captured module's forward call: "replayed" (its record traced as
    region nodes; also "direct" when without AOTAutograd's wrappers),
    "recorded" (traced on fake tensors first), or "refused" (run op by op,
    ``why``)."""
    with _lock:
        _captures[outcome] += 1
        if why is not None:
            _capture_refusals[module] = why


def count_cuda_graph(outcome: str) -> None:
    """A GPU group's code "captured" into a CUDA graph, or "replayed" (one run)."""
    with _lock:
        _cuda_graphs[outcome] += 1


def refuse_cuda_graph(group: str, why: str) -> None:
    """A group's code not captured: inputs off the GPU, or a failed capture."""
    with _lock:
        _cuda_graph_refusals[group] = why


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


def record_zero_schedule(report: dict) -> None:
    """What a profile-guided ZeRO schedule measured and chose (zero/schedule.py)."""
    with _lock:
        _zero_schedule.clear()
        _zero_schedule.update(report)


def record_memory_budget(report: dict) -> None:
    """What init(memory_budget=...) measured and chose (trace/memory_budget.py)."""
    with _lock:
        _memory_budget.clear()
        _memory_budget.update(report)


def snapshot_memory_budget() -> dict:
    with _lock:
        return dict(_memory_budget)


def reset_collective_bytes() -> None:
    with _lock:
        _collective_bytes.clear()


def count_check(name: str, mismatch: str | None) -> None:
    """numerics_check's verdict on a group's new code: None when it agreed."""
    with _lock:
        _checks["passed" if mismatch is None else "mismatched"] += 1
        if mismatch is not None:
            _check_mismatches[name] = mismatch


def record_group_failure(name: str, ops: str, reason: str) -> None:
    with _lock:
        _failure_reasons[name] = _fallen_back[name] = f"[{ops}] {reason}"


@contextlib.contextmanager
def setup_graph():
    """Counts what runs inside as one setup graph, not as a step's."""
    before = _setup_counts()
    try:
        yield
    finally:
        after = _setup_counts()
        with _lock:
            _setup.update({k: after[k] - before[k] for k in after})
            _setup["graphs"] += 1


def _setup_counts() -> dict[str, int]:
    counts = {k: v for k, v in _backend_stats().items() if isinstance(v, int)}
    counts.update({name: _ltc_counter(name) for name in _SETUP_LTC_COUNTERS})
    return counts


def _backend_stats() -> dict:
    return dict(_C.stats())


def _ltc_counter(name: str) -> int:
    return int(ltc_metrics.counter_value(name) or 0)


def ltc_fallback_counts() -> dict[str, int]:
    """LTC's eager-fallback counters (op name -> calls) since reset()."""
    with _lock:
        refused = dict(_refused)
    counts = {name: _ltc_counter(name) - refused.get(name, 0) for name in ltc_metrics.counter_names()
              if name.startswith("aten::")}
    return {name: n for name, n in counts.items() if n > 0}


def snapshot() -> dict:
    with _lock:
        setup = dict(_setup)
    stats = {k: v - setup.get(k, 0) if isinstance(v, int) else v for k, v in _backend_stats().items()}
    fallbacks = collections.Counter(ltc_fallback_counts())
    with _lock:
        fallbacks.update(_fallbacks)
        groups_per_graph = collections.Counter(g.split(".")[0] for g in _groups)
        fallen_back = dict(_fallen_back)
        fallback_group_calls = _fallback_group_calls
        interpreted_group_calls = _interpreted_group_calls
        worker_compiles, worker_seconds = _worker_compiles
        fallback_sources = dict(_fallback_sources)
        syncs = dict(_syncs)
        stages = dict(_stage_seconds)
        stage_runs = dict(_stage_runs)
        group_cache = dict(_group_cache)
        recompiles = [dict(r) for r in _recompiles]
        optimizer_groups = dict(_optimizer_groups)
        captures = dict(_captures)
        capture_refusals = dict(_capture_refusals)
        checks = dict(_checks)
        check_mismatches = dict(_check_mismatches)
        cuda_graphs = dict(_cuda_graphs)
        cuda_graph_refusals = dict(_cuda_graph_refusals)
    mark_steps = _ltc_counter("MarkStep") - setup.get("MarkStep", 0)
    uncached = _ltc_counter("UncachedCompile") - setup.get("UncachedCompile", 0)
    cached = _ltc_counter("CachedCompile") - setup.get("CachedCompile", 0)
    return {
        "mark_steps": mark_steps,
        # graphs run to set up training (steady_state), left out of every other figure
        "setup_graphs": setup.get("graphs", 0),
        "traces": uncached + cached,
        "compiles": stats["compiles"],
        # LTC's cache gave a graph bound to other parameters: lowered again (parameter_binding.h)
        "rebinds": stats["rebinds"],
        "cache_hits": cached,
        "cache_misses": uncached,
        "graph_executions": stats["executions"],
        "executions_per_mark_step": stats["executions"] / mark_steps if mark_steps else 0.0,
        "fallbacks": dict(fallbacks),
        "fallback_count": sum(fallbacks.values()),
        "fallback_sources": fallback_sources,
        # graph executions outside mark_step (value reads, fallbacks), by user source line
        "syncs": syncs,
        "groups_built": stats["groups_built"],
        "groups_rejected": stats["groups_rejected"],
        "groups_per_graph": dict(groups_per_graph),
        "group_calls": stats["group_calls"],
        # The two that say whether compilation happened: runs of generated
        # code, and the groups that failed or ran in TorchScript (with why).
        "compiled_group_calls": stats["group_calls"] - fallback_group_calls - interpreted_group_calls,
        # of those, calls into C++-wrapped code straight from C++ (native_call)
        "native_group_calls": stats["native_calls"],
        "groups_fallen_back": fallen_back,
        # numerics_check (init(check=True)): new code checked against TorchScript
        "checks_passed": checks.get("passed", 0),
        "checks_mismatched": checks.get("mismatched", 0),
        "check_mismatches": check_mismatches,
        # runs in TorchScript while the group's code compiled in the background (not failures)
        "interpreted_group_calls": interpreted_group_calls,
        "collective_bytes": collective_bytes(),
        # a ZeRO engine's profile-guided schedule (zero.initialize(memory_budget=...)): measured, chosen
        "zero_schedule": dict(_zero_schedule),
        # init(memory_budget=...): peaks measured per fraction of blocks checkpointed, the one chosen
        "memory_budget": dict(_memory_budget),
        "group_cache_hits": group_cache.get("hit", 0),
        "group_cache_disk_hits": group_cache.get("disk_hit", 0),
        "group_cache_misses": group_cache.get("miss", 0),
        # misses that another process (a rank of the job) was compiling: waited for, then read from disk
        "group_cache_waits": group_cache.get("wait", 0),
        # hits whose code came as the library C++ calls, without loading Inductor (compile_cache.store_native)
        "group_cache_native_loads": group_cache.get("native_load", 0),
        # groups the isolated compile worker could not take, compiled in this process instead
        "isolated_compile_failures": group_cache.get("isolated_failed", 0),
        # groups whose code a compile worker process generated (parallel_compile)
        "worker_compiles": worker_compiles,
        # groups that copy inputs into the layouts their deferred compile took, instead of compiling again
        "layouts_adapted": group_cache.get("layout_adapted", 0),
        # shape_generic: sizes served by a generic variant, generic compiles, failed tries
        "generic_hits": group_cache.get("generic_hit", 0),
        "generic_disk_hits": group_cache.get("generic_disk_hit", 0),  # variants read from the cache folder
        # sizes whose generic code came as native code (shape_generic.sized_key): no Python load
        "generic_native_loads": group_cache.get("generic_native_load", 0),
        "generic_compiles": group_cache.get("generic_compile", 0),
        "generic_failed": group_cache.get("generic_failed", 0),
        # Adam parameter-group steps traced as one node, and those that were not (why -> count)
        "optimizer_groups_fused": optimizer_groups.pop(None, 0),
        "optimizer_groups_unfused": optimizer_groups,
        # lazy_mlir.capture: forward calls replayed as region nodes, recorded, run op by op (and why)
        "captured_calls": captures.get("replayed", 0),
        "captured_direct_calls": captures.get("direct", 0),  # of those, without AOTAutograd's wrappers
        "capture_records": captures.get("recorded", 0),
        "capture_refused": captures.get("refused", 0),
        "capture_refusals": capture_refusals,
        # cuda_graphs: GPU groups' code captured, runs replayed, captures refused (group -> why)
        "cuda_graphs_captured": cuda_graphs.get("captured", 0),
        "cuda_graph_replays": cuda_graphs.get("replayed", 0),
        "cuda_graph_refusals": cuda_graph_refusals,
        # large CPU buffers of compiled groups (runtime/step_memory.h): at their offset in a
        # repeating step's plan, taken from last step's, allocated anew, freed to keep the cache
        # under its bound
        "step_memory_planned": stats["step_memory_planned"],
        "step_memory_hits": stats["step_memory_hits"],
        "step_memory_misses": stats["step_memory_misses"],
        "step_memory_evicted": stats["step_memory_evicted"],
        # buffer donation (buffer_donation.h): group outputs written into the
        # buffer of the input they replace, and inputs copied first (still in use)
        "outputs_in_place": stats["outputs_in_place"],
        "in_place_bytes": stats["in_place_bytes"],
        "donor_copies": stats["donor_copies"],
        "donor_copy_bytes": stats["donor_copy_bytes"],
        # random ops whose results nothing read, run at the sync as eager runs them (dead_draws.h)
        "dead_draws_kept": stats["dead_draws_kept"],
        # graphs that drew after the host used the CPU generator mid-step: not eager's numbers (host_generator.h)
        "draws_after_host_use": stats["draws_after_host_use"],
        "stage_runs": stage_runs,
        "recompiles": recompiles,
        "seconds": {
            "compile": stats["compile_ns"] / 1e9,
            "group_build": sum(stages.values()),
            "execute": stats["execute_ns"] / 1e9,
            "group_run": stats["group_ns"] / 1e9,
            "worker_codegen": worker_seconds,  # in compile workers, beside this process's stages
            **{f"stage.{k}": v for k, v in stages.items()},
        },
    }


def reset() -> None:
    global _fallback_group_calls, _interpreted_group_calls
    ltc_metrics.reset()
    _C.reset_stats()
    with _lock:
        _fallbacks.clear()
        _fallback_sources.clear()
        _refused.clear()
        _syncs.clear()
        _groups.clear()
        _fallen_back.clear()
        _fallback_group_calls = 0
        _interpreted_group_calls = 0
        _worker_compiles[:] = [0, 0.0]
        _stage_seconds.clear()
        _stage_runs.clear()
        _setup.clear()
        _group_cache.clear()
        _recompiles.clear()
        _collective_bytes.clear()
        _optimizer_groups.clear()
        _captures.clear()
        _capture_refusals.clear()
        _checks.clear()
        _cuda_graphs.clear()


def _memory_budget_lines(mb: dict) -> list[str]:
    mib = 2**20
    chosen = mb["chosen_fraction"]
    lines = [f"  memory budget        {mb['budget_bytes'] / mib:,.0f} MiB: "
             + ("measuring" if chosen is None else f"{chosen:.0%} of the repeated blocks checkpointed ({mb['why']})")]
    for fraction, m in sorted(mb["measured"].items()):
        lines.append(f"    {fraction:.0%} checkpointed: peak {m['peak_bytes'] / mib:,.0f} MiB (step buffers "
                     f"{m['step_buffers_bytes'] / mib:,.0f}), step {m['step_seconds'] * 1e3:,.1f} ms")
    for entry in mb["partitions"]:
        at = "; ".join(f"{f:.0%}: saves {p['saved_bytes'] / mib:,.1f} MiB, recomputes {p['recomputed_ops']} ops"
                       for f, p in entry.items() if isinstance(f, float))
        lines.append(f"    {entry['module']} ({entry['blocks']} blocks): {at}")
    return lines


def report() -> str:
    s = snapshot()
    lines = [
        "lazy_mlir metrics",
        f"  mark_steps           {s['mark_steps']}" + (f"  (and {s['setup_graphs']} setup graphs, left out here)"
                                                        if s["setup_graphs"] else ""),
        f"  traces               {s['traces']}  (graph cache hits {s['cache_hits']}, misses {s['cache_misses']})",
        f"  compiles             {s['compiles']}" + (f"  ({s['rebinds']} for another parameter binding)"
                                                      if s["rebinds"] else ""),
        f"  graph executions     {s['graph_executions']}  ({s['executions_per_mark_step']:.2f} per mark_step)",
        f"  fusion groups        {s['groups_built']} built, {s['groups_rejected']} left to TorchScript",
        f"  group calls          {s['group_calls']}  ({s['compiled_group_calls']} ran generated code"
        + (f", {s['native_group_calls']} of them called from C++" if s["native_group_calls"] else "")
        + (f", {s['interpreted_group_calls']} TorchScript while their code compiled"
           if s["interpreted_group_calls"] else "") + ")",
        f"  fell back            {len(s['groups_fallen_back'])} groups run in TorchScript",
        f"  group cache          {s['group_cache_hits']} hits, {s['group_cache_disk_hits']} from disk"
        + (f" ({s['group_cache_native_loads']} as native code)" if s["group_cache_native_loads"] else "")
        + f", {s['group_cache_misses']} misses"
        + (f" ({s['group_cache_waits']} compiled by another process meanwhile)" if s["group_cache_waits"] else "")
        + (f"; {s['isolated_compile_failures']} compiled here, the compile worker failed them"
           if s["isolated_compile_failures"] else "")
        + (f"; {s['layouts_adapted']} groups copy inputs into the layouts their code took"
           if s["layouts_adapted"] else ""),
    ]
    if s["checks_passed"] or s["checks_mismatched"]:
        lines.append(f"  numerics checks      {s['checks_passed']} new codes agreed with TorchScript, "
                     f"{s['checks_mismatched']} disagreed (run in TorchScript)")
        for text in s["check_mismatches"].values():
            lines.append(f"    {text}")
    if s["worker_compiles"]:
        lines.append(f"  compile workers      {s['worker_compiles']} groups' code generated beside this process "
                     f"({s['seconds']['worker_codegen']:.1f} s there)")
    if s["generic_hits"] or s["generic_compiles"] or s["generic_failed"]:
        lines.append(f"  shape-generic        {s['generic_hits']} sizes served ({s['generic_disk_hits']} variants "
                     "read from disk" + (f", {s['generic_native_loads']} sizes as native code"
                                         if s["generic_native_loads"] else "")
                     + f"), {s['generic_compiles']} compiled, {s['generic_failed']} failed (compiled static)")
    if s["groups_per_graph"]:
        per = ", ".join(f"{g}: {n}" for g, n in sorted(s["groups_per_graph"].items()))
        lines.append(f"  groups per graph     {per}")
    if s["optimizer_groups_fused"] or s["optimizer_groups_unfused"]:
        unfused = sum(s["optimizer_groups_unfused"].values())
        why = ", ".join(f"{n} x {reason}" for reason, n in s["optimizer_groups_unfused"].items())
        lines.append(f"  optimizer groups     {s['optimizer_groups_fused']} fused steps, {unfused} not fused"
                     + (f" ({why})" if why else ""))
    if s["captured_calls"] or s["capture_records"] or s["capture_refused"]:
        lines.append(f"  captured forwards    {s['captured_calls']} calls replayed ({s['captured_direct_calls']} direct), "
                     f"{s['capture_records']} recorded, "
                     f"{s['capture_refused']} run op by op")
        for module, why in s["capture_refusals"].items():
            lines.append(f"    {module}: {why}")
    if s["outputs_in_place"] or s["donor_copies"]:
        lines.append(f"  written in place     {s['outputs_in_place']} outputs ({s['in_place_bytes'] / 2**20:.1f} MiB) "
                     f"into the buffers they replace; {s['donor_copies']} buffers copied first, still in use "
                     f"({s['donor_copy_bytes'] / 2**20:.1f} MiB)")
    if s["memory_budget"]:
        lines.extend(_memory_budget_lines(s["memory_budget"]))
    if s["dead_draws_kept"]:
        lines.append(f"  unused draws         {s['dead_draws_kept']} random ops nothing read, run as eager runs them")
    if s["draws_after_host_use"]:
        lines.append(f"  draws after host use {s['draws_after_host_use']} graphs drew after the host used the CPU "
                     "generator mid-step: not eager's numbers")
    if s["cuda_graphs_captured"] or s["cuda_graph_refusals"]:
        lines.append(f"  CUDA graphs          {s['cuda_graphs_captured']} captured, "
                     f"{s['cuda_graph_replays']} replays")
        for group, why in s["cuda_graph_refusals"].items():
            lines.append(f"    not captured {group}: {why}")
    lines.append(f"  fallbacks            {s['fallback_count']}")
    for op, n in sorted(s["fallbacks"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {op:<30} {n}")
    for where, n in sorted(s["fallback_sources"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {n} x {where}")
    if s["syncs"]:
        lines.append(f"  syncs                {sum(s['syncs'].values())} graph executions outside mark_step")
        for where, n in sorted(s["syncs"].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {n} x {where}")
    for name, why in s["groups_fallen_back"].items():
        lines.append(f"  fell back {name}: {why}")
    if s["recompiles"]:
        lines.append(f"  recompiles           {len(s['recompiles'])}")
        for record in s["recompiles"]:
            lines.append(f"    {format_recompile(record)}")
    lines.append("  seconds              " + ", ".join(f"{k} {v:.3f}" for k, v in s["seconds"].items()))
    return "\n".join(lines)
