"""Executables bound into CompiledGroup: callables list[Tensor] -> list[Tensor].

GroupExecutable lowers its group through MLIR at the group's first run (the
inputs fix shapes and dtypes; LTC keys graphs by shape, so they do not
change) and from then on calls the generated code directly.
TorchScriptExecutable runs the group's own TorchScript subgraph: the
fallback for a group that fails to lower at O1, and the stand-in for a group
whose shape-generic code compiles in the background (``background``).
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from concurrent.futures import Future

import torch
from torch._C._dynamo.guards import TensorGuards

from . import background, compile_cache, config, group_key, metrics, recompiles, shape_generic
from .group_lowering import lower_group


class TorchScriptExecutable:
    """Runs a fusion group's subgraph with the TorchScript graph executor;
    each run is counted by ``count`` (the name): a fallback by default, a run
    while compiling (``metrics.count_interpreted_group_call``), or nothing
    (None: a setup graph's group, nothing worth compiling)."""

    def __init__(self, graph: torch._C.Graph, name: str, count=metrics.count_fallback_group_call):
        graph = graph.copy()
        outputs = list(graph.outputs())
        self.num_outputs = len(outputs)
        self.shared = _shared_outputs(outputs)
        if self.num_outputs != 1:
            # A TorchScript function returns one value: pack several in a tuple.
            for _ in outputs:
                graph.eraseOutput(0)
            tup = graph.create("prim::TupleConstruct", outputs)
            tup.output().setType(torch._C.TupleType([v.type() for v in outputs]))
            tup.insertBefore(graph.return_node())
            graph.registerOutput(tup.output())
        self.function = torch._C._create_function_from_graph(name.replace(".", "_"), graph)
        self.name = name
        self.count = count

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.count is not None:
            self.count(self.name)
        out = self.function(*inputs)
        if self.num_outputs == 1:
            return [out]
        out = list(out)
        for k, j in self.shared:
            out[k] = out[j]
        return out


def _shared_outputs(outputs: list[torch._C.Value]) -> list[tuple[int, int]]:
    """(k, j): output k is ``detach_copy`` of output j. The generated code
    returns one tensor for both (a parameter and its functionalization base:
    steady_state); TorchScript copies. The next graph's inputs must alias as
    after generated code, or it is another graph (and its groups another
    family of shapes) than every step after."""
    position = {v: j for j, v in enumerate(outputs)}
    return [(k, position[v.node().inputsAt(0)]) for k, v in enumerate(outputs)
            if v.node().kind() == "aten::detach_copy" and v.node().inputsAt(0) in position]


class GroupLoweringError(RuntimeError):
    pass


def report_failure(name: str, describe: str, exc: Exception) -> None:
    """A group that failed to compile and runs in TorchScript: metrics and a warning."""
    reason = f"{type(exc).__name__}: {exc}"
    metrics.record_group_failure(name, describe, reason)
    warnings.warn(f"lazy_mlir: fusion group {name} [{describe}] failed to compile ({reason}); "
                  "it runs in TorchScript instead", RuntimeWarning, stacklevel=1)


def layout_guard(inputs: list[torch.Tensor]):
    """A C++ check (Dynamo's) of each input's dtype, device, sizes and strides,
    ~0.1 us per input. Storage offsets need none: Inductor copies inputs it
    assumed aligned when they are not."""
    first = {}
    for i, t in enumerate(inputs):
        first.setdefault(id(t), i)
    if len(first) < len(inputs):
        return _DistinctGuard(inputs, first)
    return TensorGuards(*inputs, dynamic_dims_sizes=[list(t.shape) for t in inputs],
                        dynamic_dims_strides=[list(t.stride()) for t in inputs])


class _DistinctGuard:
    """TensorGuards fails on any list holding one tensor twice (LTC passes a
    weight read by forward and by its update twice): it guards the distinct
    tensors, and checks that the same positions still hold one tensor."""

    def __init__(self, inputs, first: dict):
        self.distinct = sorted(first.values())
        self.repeats = [(i, first[id(t)]) for i, t in enumerate(inputs) if first[id(t)] != i]
        self.guard = layout_guard([inputs[i] for i in self.distinct])

    def check(self, *inputs) -> bool:
        return (all(inputs[i] is inputs[j] for i, j in self.repeats)
                and self.guard.check(*(inputs[i] for i in self.distinct)))


class ScalarGuards:
    """Checks the scalar inputs whose values were baked into the code
    (``LoweredGroup.guards``) without reading a value it already knows:
    ``.item()`` waits for the device, a host sync per step on a GPU. A tensor
    seen to hold its value is held on to (its memory cannot then be reused
    for another) and recognised by data pointer and version counter. LTC
    passes a step's Python scalars as device data it caches by value, so
    steady-state steps hand over the very tensors seen before."""

    def __init__(self, guards: list[tuple[int, object]]):
        self.guards = guards
        self.known: dict[int, tuple[torch.Tensor, int]] = {}  # guard -> (tensor, version) holding its value

    def hold(self, inputs: list[torch.Tensor]) -> bool:
        for k, (i, value) in enumerate(self.guards):
            t, known = inputs[i], self.known.get(k)
            if known is not None and known[0].data_ptr() == t.data_ptr() and known[1] == t._version:
                continue
            if not compile_cache.same_scalar(t.item(), value):
                return False
            self.known[k] = (t, t._version)
        return True


@dataclasses.dataclass
class _Compiling:
    """A group's shape-generic code compiling on the worker thread: the group
    runs in TorchScript until ``future`` is done (its result: the code, or
    None when that compile failed and the static form is to be compiled)."""
    future: Future
    started_here: bool  # this group's sizes asked for it (else it waits on its family's)


class GroupExecutable:
    def __init__(self, graph: torch._C.Graph, name: str, cfg: config.Config, describe: str, num_ops: int):
        self.graph = graph.copy()
        self.name = name
        self.num_ops = num_ops
        self.cfg = cfg
        self.describe = describe  # the group's ops and source lines, for messages
        self.cache_key = None
        self.layout = None  # TensorGuards of the inputs the current code was compiled for
        self._layouts: list[tuple[TensorGuards, str]] = []  # (guard, cache key) per layout seen
        self._family = None  # group_key.family(graph), computed at the first compile
        self._run = self._for_layout

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._run(inputs)

    def offer_donation(self, positions) -> list[int]:
        """Before the first run the C++ binder offers the inputs only this group
        reads (lazy_backend/buffer_donation.h); the code may write outputs into
        those accepted (lazy_mlir.donation), which become part of the group's
        configuration, hence of its cache key."""
        if not self.cfg.donate_buffers or self.cfg.ltc_thread_pool or not positions:
            return []  # with LTC's IO thread no buffer is ever known dead: every one would be copied
        accepted = tuple(sorted(int(k) for k in positions))
        self.cfg = dataclasses.replace(self.cfg, donated_inputs=accepted)
        return list(accepted)

    def _for_layout(self, inputs, count_miss=True):
        """First run, or inputs unlike those the current code was compiled for:
        LTC's graph hash fixes shapes and dtypes but not strides (a
        channels_last input), and Inductor's code asserts them."""
        for guard, key in self._layouts:
            if guard.check(*inputs):
                break
        else:
            guard, key = layout_guard(inputs), group_key.group_key(self.graph, inputs, self.cfg.key())
            self._layouts.append((guard, key))
        self.layout, self.cache_key = guard, key
        self._use(self._lowered_for(inputs, count_miss))
        try:
            return self._run(inputs)
        except Exception as exc:  # noqa: BLE001 - at O1 code that fails its first run falls back
            if self.lowered is None or self.cfg.level == "O2":
                raise
            report_failure(self.name, self.describe, exc)
            self._use(None)  # else every later step would fail the same way
            return self._run(inputs)

    def _guarded(self, inputs):
        if not self.layout.check(*inputs):
            return self._for_layout(inputs)
        return self.lowered.run(inputs)

    def _use(self, lowered):
        if isinstance(lowered, _Compiling):
            self.lowered, self._compiling = None, lowered
            self._interpreter = TorchScriptExecutable(self.graph, self.name, metrics.count_interpreted_group_call)
            self._run = self._while_compiling
            return
        self.lowered = lowered
        if lowered is None:
            self._run = TorchScriptExecutable(self.graph, self.name)
        elif lowered.guards or lowered.collective_bytes:
            self._scalars = ScalarGuards(lowered.guards)
            self._run = self._checked
        else:
            self._run = self._guarded  # the hot path: a layout check, then the generated code

    def _while_compiling(self, inputs):
        compiling = self._compiling
        if not compiling.future.done():
            return self._interpreter(inputs)
        self._compiling = self._interpreter = None
        generic = None if compiling.future.exception() is not None else compiling.future.result()
        if generic is not None and compiling.started_here:
            recompiles.add_variant(self._family, self.graph, self.name, inputs, generic.guards, self.describe,
                                   self.cfg, self.cfg.key())
        # as at a first run: the generic code if it admits these sizes, else a
        # compile (its cache miss was counted when the background compile began)
        return self._for_layout(inputs, count_miss=False)

    def _checked(self, inputs):
        if not self.layout.check(*inputs):
            return self._for_layout(inputs)
        if not self._scalars.hold(inputs):
            # A scalar whose value was baked in (a shape depends on it) changed.
            self._use(self._lowered_for(inputs))
            return self._run(inputs)
        if self.lowered.collective_bytes:
            metrics.count_collectives(self.lowered.collective_bytes)
        return self.lowered.run(inputs)

    def _lowered_for(self, inputs, count_miss=True):
        if self._family is None:
            self._family = group_key.family(self.graph)
        lowered = self._cached(inputs, count_miss)
        generic = None
        sighting = shape_generic.sight(self.graph, inputs, self.cfg)  # also on a hit: sizes seen count
        if lowered is None and sighting is not None:
            lowered = generic = shape_generic.lookup(sighting, inputs, self.name, self.cfg)
            if generic is not None:
                compile_cache.store(self.cache_key, generic, self.cfg)  # in memory: no artefacts
        if lowered is None:
            if self._failed_before():
                return None
            compiling = self._in_background(inputs, sighting)
            if compiling is not None:
                return compiling
            with compile_cache.exclusive(self.cache_key, self.cfg, self._waiting):
                # another process (a rank) may have compiled it meanwhile, or failed to
                lowered = self._cached(inputs, count_miss=False)
                if lowered is None:
                    if self._failed_before():
                        return None
                    recompiles.before_compile(self._family, self.graph, inputs, self.name, self.describe,
                                              self.cfg, self.cfg.key())
                    lowered = self._compile(inputs, sighting)
                    if lowered is None:
                        return None
                    compile_cache.store(self.cache_key, lowered, self.cfg)
        if sighting is not None:
            shape_generic.observe(sighting)
        if generic is None:  # a size served by generic code is no new variant
            recompiles.add_variant(self._family, self.graph, self.name, inputs, lowered.guards, self.describe,
                                   self.cfg, self.cfg.key())
        return lowered

    def _cached(self, inputs, count_miss):
        # Dumps show every group's real lowering: with dump_dir set, no cache serves it.
        if self.cfg.dump_dir:
            return None
        return compile_cache.lookup(self.cache_key, inputs, self.name, self.cfg, count_miss)

    def _failed_before(self) -> bool:
        """Whether lowering this group failed before, in this process or
        another: then it is not tried again (O1 runs it in TorchScript)."""
        failed = compile_cache.known_failure(self.cache_key, self.cfg)
        if failed is not None:
            self._fail(GroupLoweringError(f"it failed before, in this environment ({failed}); "
                                          "LAZY_MLIR_CACHE=0 or an emptied cache folder retries it"))
        return failed is not None

    def _waiting(self) -> None:
        metrics.count_cache("wait")
        if self.cfg.progress:
            print(f"lazy_mlir: {self.name}: another process (a rank of this job?) is compiling the same group; "
                  "waiting for it to land in the cache", file=sys.stderr, flush=True)

    def _compile(self, inputs, sighting=None):
        start = time.perf_counter()
        if self.cfg.progress:
            print(f"lazy_mlir: compiling {self.name} ({self.num_ops} ops) ...", file=sys.stderr, flush=True)
        try:
            with background.compile_lock:  # after any compile running in the background
                planned = sighting and shape_generic.plan(sighting, inputs)
                lowered = ((planned and self._compile_generic(inputs, sighting, planned))
                           or lower_group(self.graph, inputs, self.name, self.cfg))
        except Exception as exc:  # noqa: BLE001 - O1 falls back to TorchScript, O2 fails
            compile_cache.store_failure(self.cache_key, f"{type(exc).__name__}: {exc}", self.cfg)
            self._fail(exc)
            return None
        if self.cfg.progress:
            print(f"lazy_mlir: compiled {self.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        return lowered

    def _fail(self, exc: Exception) -> None:
        """A group that cannot be lowered: O1 runs it in TorchScript, O2 fails."""
        if self.cfg.level == "O2":
            metrics.record_group_failure(self.name, self.describe, f"{type(exc).__name__}: {exc}")
            raise GroupLoweringError(f"lazy_mlir O2: the step failed to compile ({type(exc).__name__}: {exc}); "
                                     f"group ops: {self.describe}. Use level=\"O1\" to run such groups in "
                                     "TorchScript.") from exc
        report_failure(self.name, self.describe, exc)

    def _in_background(self, inputs, sighting):
        """At O1 with ``Config.background_compile``, a shape-generic compile
        runs on the worker thread while the group runs in TorchScript: a
        ``_Compiling`` for this group's sizes, or for its family's compile
        already running (a third size waits for the second's code). None: a
        compile here and now (no generic form planned, not in the background,
        or the other size came in this graph's run: its first, which compiles
        its other groups anyway)."""
        if sighting is None or not self.cfg.background_compile or self.cfg.level != "O1":
            return None
        if shape_generic.seen_in_this_execution(sighting):
            return None
        future = background.pending(sighting.family)
        if future is not None:
            return _Compiling(future, started_here=False)
        planned = shape_generic.plan(sighting, inputs)
        if planned is None:
            return None
        recompiles.before_compile(self._family, self.graph, inputs, self.name, self.describe, self.cfg,
                                  self.cfg.key())
        if self.cfg.progress:
            print(f"lazy_mlir: {self.name} seen at other sizes: compiling it shape-generic in the background "
                  f"({self.num_ops} ops); it runs in TorchScript until then", file=sys.stderr, flush=True)
        # What the compile reads of the inputs: the values of 0-d ones, copied
        # (later steps may overwrite them), and sizes and strides, held by a
        # view of each (TorchScript resizes an out= input in place, as
        # arange's: the compile must see the sizes LTC traced).
        example = [t.clone() if t.dim() == 0 else t.as_strided(t.shape, t.stride(), t.storage_offset())
                   for t in inputs]
        return _Compiling(background.submit(sighting.family,
                                            lambda: self._compile_generic(example, sighting, planned, True)),
                          started_here=True)

    def _compile_generic(self, inputs, sighting, planned, in_background=False):
        """The shape-generic form planned by ``shape_generic.plan``; None
        (compile the static form) when it fails."""
        start = time.perf_counter()
        if self.cfg.progress and not in_background:
            print(f"lazy_mlir: {self.name} seen at other sizes: compiling it shape-generic", file=sys.stderr,
                  flush=True)
        try:
            lowered = shape_generic.compile_generic(self.graph, inputs, self.name, self.cfg, sighting, planned)
        except Exception as exc:  # noqa: BLE001 - the static form is always there to fall back on
            shape_generic.give_up(sighting.family)
            metrics.count_cache("generic_failed")
            warnings.warn(f"lazy_mlir: fusion group {self.name} could not be compiled shape-generic "
                          f"({type(exc).__name__}: {exc}); compiling it for these sizes only", RuntimeWarning,
                          stacklevel=1)
            return None
        metrics.count_cache("generic_compile")
        if self.cfg.progress and in_background:
            print(f"lazy_mlir: {self.name} compiled shape-generic in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
        return lowered
