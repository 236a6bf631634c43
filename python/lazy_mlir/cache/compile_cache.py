"""Lowered groups across graphs, configurations and processes.

LTC already compiles a graph once per graph hash; this cache serves the same
group again when LTC hands it over anew (another graph containing it, the
same code traced from another line, a return to an earlier configuration)
and, through a folder on disk (``Config.cache``, on by default), in the next
process. Keys come from ``group_key``; a group whose code depends on the
value of a scalar input (``LoweredGroup.guards``) has one variant per value.

On disk, the entry at a key holds the variant itself, or, for a guarded
group, only the positions of the guarded inputs: the variant then lives at
a key derived from their values. A payload that is not what we wrote (a
pickle error, a wrong key) is removed with a warning and rebuilt, like one
whose checksum fails.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import math
import pickle
import warnings

import torch

from .. import config
from ..codegen import native_call
from ..lowering import lowering_function
from ..lowering.lowered_group import LoadOnFirstCall, LoweredGroup
from ..observe import metrics
from .disk_cache import DiskCache

load_group = lowering_function("load_group")

class _Recent(collections.OrderedDict):
    """A dict of the ``Config.memory_cache_entries`` keys stored or looked up
    last: what a loop no longer uses leaves memory (the disk keeps it)."""

    def get(self, key, default=None):
        if key not in self:
            return default
        self.move_to_end(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > config.current.memory_cache_entries:
            self.popitem(last=False)


_entries: _Recent = _Recent()  # key -> [LoweredGroup]: variants differing in guard values
_failures: _Recent = _Recent()  # key -> why its lowering failed (also on disk)
_adaptations: _Recent = _Recent()  # key -> (code's key, moves): store_adaptation


def _add_variant(key: str, lowered: LoweredGroup) -> None:
    _entries[key] = [*_entries.get(key, ()), lowered]


def memory_entries() -> int:
    """How many groups' compiled variants this process keeps (bounded by ``Config.memory_cache_entries``)."""
    return len(_entries)


def disk_of(cfg: config.Config) -> DiskCache | None:
    if not cfg.cache:
        return None
    return DiskCache(cfg.cache_dir, cfg.cache_max_mb << 20)


def same_scalar(value, baked) -> bool:
    """Whether a scalar input holds the value baked into a group's code:
    ``==`` but for floats, where -0.0 is not 0.0 (``1 / leaky_relu(x, -0.0)``
    is +inf where 0.0 gives -inf) and NaN is NaN (else never served)."""
    if isinstance(value, float) and isinstance(baked, float):
        if math.isnan(value) or math.isnan(baked):
            return math.isnan(value) and math.isnan(baked)
        return value == baked and math.copysign(1.0, value) == math.copysign(1.0, baked)
    return value == baked


def _variant_key(key: str, values: tuple) -> str:
    return hashlib.sha256(f"{key}|{values!r}".encode()).hexdigest()


def _guard_values(inputs: list[torch.Tensor], positions) -> tuple:
    return tuple(inputs[i].item() for i in positions)


def lookup(key: str, inputs: list[torch.Tensor], name: str, cfg: config.Config,
           count_miss: bool = True) -> LoweredGroup | None:
    """A variant whose guards hold for ``inputs``: from memory, else from disk
    (counted as "hit", "disk_hit"); None (a "miss", unless ``count_miss`` is
    False: the group's miss was counted already) when it must be compiled."""
    for lowered in _entries.get(key, ()):
        if all(same_scalar(inputs[i].item(), v) for i, v in lowered.guards):
            metrics.count_cache("hit")
            return lowered
    disk = disk_of(cfg)
    lowered = _load(disk, key, inputs, name) if disk is not None else None
    if lowered is not None:
        _add_variant(key, lowered)
        metrics.count_cache("disk_hit")
        return lowered
    if count_miss:
        metrics.count_cache("miss")
    return None


def exclusive(key: str, cfg: config.Config, on_wait=None):
    """A context in which this process alone, of those sharing the cache
    folder, compiles the group at ``key``: ranks of a job that need the same
    group wait (``on_wait()`` says so) and then read the first one's entry.
    No lock without a cache folder, nor with dumps on (each process lowers
    its own groups then)."""
    disk = disk_of(cfg)
    if disk is None or cfg.dump_dir:
        return contextlib.nullcontext()
    return disk.lock(key, on_wait)


def read_entry(disk: DiskCache, key: str) -> dict | None:
    payload = disk.read(key)
    if payload is None:
        return None
    try:
        entry = pickle.loads(payload)
        if entry.get("key") != key:
            raise ValueError("entry written for another key")
    except Exception as exc:  # noqa: BLE001 - anything unreadable is rebuilt
        disk.discard(key, f"{type(exc).__name__}: {exc}")
        return None
    return entry


def _load(disk: DiskCache, key: str, inputs: list[torch.Tensor], name: str) -> LoweredGroup | None:
    entry = read_entry(disk, key)
    if entry is not None and entry["guarded_inputs"]:
        key = _variant_key(key, _guard_values(inputs, entry["guarded_inputs"]))
        entry = read_entry(disk, key)
    if entry is None:
        return None
    native = _native_plan(disk, key)
    if native is not None:
        return LoweredGroup(LoadOnFirstCall(lambda inputs: _load_python(disk, key, name, inputs)), entry["guards"],
                            entry["collective_bytes"], native=native, disk_key=key)
    try:
        lowered = load_group(entry["artifacts"], entry["guards"], entry["collective_bytes"], inputs, name)
        lowered.disk_key = key
        return lowered
    except Exception as exc:  # noqa: BLE001 - a stale or broken entry: compile instead
        disk.discard(key, f"cannot be loaded: {type(exc).__name__}: {exc}")
        return None


def store(key: str, lowered: LoweredGroup, cfg: config.Config) -> None:
    _add_variant(key, lowered)
    artifacts, lowered.artifacts = lowered.artifacts, None  # on disk from now on, not in memory
    disk = disk_of(cfg)
    if disk is None or artifacts is None:
        return
    positions = [i for i, _ in lowered.guards]
    entry = {"key": key, "guarded_inputs": positions, "guards": lowered.guards,
             "collective_bytes": lowered.collective_bytes, "artifacts": artifacts}
    try:
        variant = key
        if positions:
            variant = _variant_key(key, tuple(v for _, v in lowered.guards))
            disk.write(variant, pickle.dumps({**entry, "key": variant}))
            entry = {"key": key, "guarded_inputs": positions}
        if disk.write(key, pickle.dumps(entry)):
            lowered.disk_key = variant
            if lowered.native is not None:  # compiled in a worker (isolated_compile), planned there
                store_native(lowered, lowered.native, cfg)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        warnings.warn(f"lazy_mlir: cannot store a compiled group in the cache ({exc})", RuntimeWarning, stacklevel=2)


def _native_key(key: str) -> str:
    return hashlib.sha256(f"native|{key}".encode()).hexdigest()


def store_native(lowered: LoweredGroup, plan: native_call.Plan, cfg: config.Config) -> None:
    """Adds to a stored variant its code as the library C++ calls (the plan
    its first run's probe found) and the library's bytes: a later process
    calls that code without loading Inductor, MLIR or sympy."""
    disk = disk_of(cfg)
    if disk is None or lowered.disk_key is None:
        return
    try:
        with open(plan.library, "rb") as f:
            library = f.read()
    except OSError:
        return  # Inductor's cache was emptied meanwhile: later processes load the artefact
    key = _native_key(lowered.disk_key)
    disk.write(key, pickle.dumps({"key": key, "arguments": plan.arguments, "num_results": plan.num_results,
                                  "outputs": plan.outputs, "aliases": plan.aliases, "library": library}))


def generic_native_plan(key: str, cfg: config.Config) -> native_call.Plan | None:
    """The native plan stored for a shape-generic variant at some sizes
    (shape_generic.sized_key), or None; counted as "generic_native_load"."""
    disk = disk_of(cfg)
    return _native_plan(disk, key, "generic_native_load") if disk is not None else None


def _native_plan(disk: DiskCache, key: str, counted: str = "native_load") -> native_call.Plan | None:
    """The stored variant's native plan, its library written out as a file."""
    entry = read_entry(disk, _native_key(key))
    if entry is None:
        return None
    path = disk.library(hashlib.sha256(entry["library"]).hexdigest(), entry["library"])
    if path is None:
        return None
    metrics.count_cache(counted)
    return native_call.Plan(path, entry["arguments"], entry["num_results"], entry["outputs"], entry.get("aliases", []))


def _load_python(disk: DiskCache, key: str, name: str, inputs: list[torch.Tensor]):
    """The Python callable of a variant loaded as a native library."""
    entry = read_entry(disk, key)
    if entry is None:
        raise RuntimeError(f"the compile cache's entry of {name} is gone")
    return load_group(entry["artifacts"], entry["guards"], entry["collective_bytes"], inputs, name).run


def _write_record(entry_key: str, field: str, value, cfg: config.Config) -> None:
    """A small entry (an adaptation, a failure) in the cache folder, if there is one."""
    disk = disk_of(cfg)
    if disk is not None:
        disk.write(entry_key, pickle.dumps({"key": entry_key, field: value}))


def _read_record(entry_key: str, field: str, kind: type, cfg: config.Config):
    """The value a _write_record left, if it is a ``kind``; else None."""
    disk = disk_of(cfg)
    entry = read_entry(disk, entry_key) if disk is not None else None
    value = None if entry is None else entry.get(field)
    return value if isinstance(value, kind) else None


def _adaptation_key(key: str) -> str:
    return hashlib.sha256(f"adapted|{key}".encode()).hexdigest()


def store_adaptation(key: str, code_key: str, moves: list[tuple[int, tuple]], cfg: config.Config) -> None:
    """Inputs whose layouts give ``key`` run the code stored at ``code_key``
    once ``moves`` ((input, strides) each) copy them into its layouts
    (GroupExecutable._adapt_layouts). Code compiled while its graph ran in
    TorchScript took the layouts TorchScript gave; a later process, whose
    earlier groups run cached code from the start, gives it the layouts
    that code returns, and finds it here instead of compiling again."""
    if _adaptations.get(key) == (code_key, list(moves)):
        return  # known, and on disk (another graph's copy of the group adapted alike)
    _adaptations[key] = (code_key, list(moves))
    _write_record(_adaptation_key(key), "adaptation", (code_key, list(moves)), cfg)


def adaptation(key: str, cfg: config.Config) -> tuple[str, list] | None:
    """(code's key, moves) stored for inputs at ``key`` by store_adaptation, or None."""
    known = _adaptations.get(key)
    if known is None:
        stored = _read_record(_adaptation_key(key), "adaptation", tuple, cfg)
        if stored is None:
            return None
        code_key, moves = stored
        known = _adaptations[key] = code_key, [(int(i), tuple(strides)) for i, strides in moves]
    return known


def _failure_key(key: str) -> str:
    return hashlib.sha256(f"failed|{key}".encode()).hexdigest()


def store_failure(key: str, reason: str, cfg: config.Config, on_disk: bool = True) -> None:
    """Remembers that the group at ``key`` failed to lower: it is not tried
    again in this process nor, through the disk cache (``on_disk``), in the
    next one (the key covers versions and lowering code, so a fix retries it)."""
    _failures[key] = reason
    if on_disk:
        _write_record(_failure_key(key), "failed", reason, cfg)


def discard_code(key: str, lowered: LoweredGroup, reason: str, cfg: config.Config) -> None:
    """Code found wrong (numerics_check): no longer served, here or from the
    disk cache, and the group remembered as failed in this process (it runs
    in TorchScript); a later process compiles it again (and, checking,
    checks it again)."""
    variants = _entries.get(key, [])
    if lowered in variants:
        variants.remove(lowered)
    disk = disk_of(cfg)
    if disk is not None:
        for entry in {key, lowered.disk_key or key}:
            disk.remove(entry)
    store_failure(key, reason, cfg, on_disk=False)


def known_failure(key: str, cfg: config.Config) -> str | None:
    """Why the group at ``key`` failed before, or None."""
    reason = _failures.get(key)
    if reason is None:
        reason = _read_record(_failure_key(key), "failed", str, cfg)
        if reason is not None:
            _failures[key] = reason
    return reason


def forget_failures() -> None:
    """Forgets the failures remembered in memory (tests; the folder keeps its own)."""
    _failures.clear()


def clear_memory() -> None:
    """Forgets the in-memory variants, failures and adaptations (tests: the next lookup goes to disk)."""
    _entries.clear()
    _failures.clear()
    _adaptations.clear()
