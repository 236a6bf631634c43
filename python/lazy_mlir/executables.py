"""Executables bound into CompiledGroup: callables list[Tensor] -> list[Tensor].

GroupExecutable lowers its group through MLIR at the group's first run (the
inputs fix shapes and dtypes; LTC keys graphs by shape, so they do not
change) and from then on calls the generated code directly.
TorchScriptExecutable runs the group's own TorchScript subgraph: the
fallback for a group that fails to lower at O1.
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings

import torch
from torch._C._dynamo.guards import TensorGuards

from . import compile_cache, config, group_key, metrics, recompiles, shape_generic
from .group_lowering import lower_group


class TorchScriptExecutable:
    """Runs a fusion group's subgraph with the TorchScript graph executor;
    each run counts as a fallback unless ``fallback`` is False (a setup
    graph's group: nothing worth compiling)."""

    def __init__(self, graph: torch._C.Graph, name: str, fallback: bool = True):
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
        self.name = name
        self.fallback = fallback

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.fallback:
            metrics.count_fallback_group_call(self.name)
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

    def _for_layout(self, inputs):
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
        self._use(self._lowered_for(inputs))
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
        self.lowered = lowered
        if lowered is None:
            self._run = TorchScriptExecutable(self.graph, self.name)
        elif lowered.guards or lowered.collective_bytes:
            self._scalars = ScalarGuards(lowered.guards)
            self._run = self._checked
        else:
            self._run = self._guarded  # the hot path: a layout check, then the generated code

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

    def _lowered_for(self, inputs):
        if self._family is None:
            self._family = group_key.family(self.graph)
        # Dumps show every group's real lowering: with dump_dir set, no cache serves it.
        lowered = None if self.cfg.dump_dir else compile_cache.lookup(self.cache_key, inputs, self.name, self.cfg)
        generic = None
        sighting = shape_generic.sight(self.graph, inputs, self.cfg)  # also on a hit: sizes seen count
        if lowered is None and sighting is not None:
            lowered = generic = shape_generic.lookup(sighting, inputs, self.name, self.cfg)
            if generic is not None:
                compile_cache.store(self.cache_key, generic, self.cfg)  # in memory: no artefacts
        if lowered is None:
            failed = compile_cache.known_failure(self.cache_key, self.cfg)
            if failed is not None:  # not retried every step, nor in every process
                self._fail(GroupLoweringError(f"it failed before, in this environment ({failed}); "
                                              "LAZY_MLIR_CACHE=0 or an emptied cache folder retries it"))
                return None
            recompiles.before_compile(self._family, self.graph, inputs, self.name, self.describe, self.cfg,
                                      self.cfg.key())
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

    def _compile(self, inputs, sighting=None):
        start = time.perf_counter()
        if self.cfg.progress:
            print(f"lazy_mlir: compiling {self.name} ({self.num_ops} ops) ...", file=sys.stderr, flush=True)
        try:
            lowered = ((sighting and self._compile_generic(inputs, sighting))
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

    def _compile_generic(self, inputs, sighting):
        """The shape-generic form when the group was seen at other sizes; None
        (compile the static form) when it cannot be made or fails."""
        planned = shape_generic.plan(sighting, inputs)
        if planned is None:
            return None
        if self.cfg.progress:
            print(f"lazy_mlir: {self.name} seen at other sizes: compiling it shape-generic", file=sys.stderr,
                  flush=True)
        try:
            lowered = shape_generic.compile_generic(self.graph, inputs, self.name, self.cfg, sighting, planned)
        except Exception as exc:  # noqa: BLE001 - the static form is always there to fall back on
            metrics.count_cache("generic_failed")
            warnings.warn(f"lazy_mlir: fusion group {self.name} could not be compiled shape-generic "
                          f"({type(exc).__name__}: {exc}); compiling it for these sizes only", RuntimeWarning,
                          stacklevel=1)
            return None
        metrics.count_cache("generic_compile")
        return lowered
