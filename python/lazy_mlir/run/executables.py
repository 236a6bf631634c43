"""Executables bound into CompiledGroup: callables list[Tensor] -> list[Tensor].

GroupExecutable lowers its group through MLIR at the group's first run (the
inputs fix shapes and dtypes; LTC keys graphs by shape, so they do not
change) and from then on calls the generated code directly.
TorchScriptExecutable runs the group's own TorchScript subgraph: the
fallback for a group that fails to lower at O1, and the stand-in for a group
whose shape-generic code compiles in the background (``background``).

Why one module of ~700 lines: ``GroupExecutable`` is one state machine per
group (first run, input layouts, scalar guards, native calls, CUDA graphs,
the numerics check), and its states share the group's code and key; which
way new code compiles is ``compile.routes``'s, not this module's.
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from concurrent.futures import Future

import torch
from torch._C._dynamo.guards import TensorGuards

from .. import config
from ..cache import compile_cache, group_key, recompiles
from ..cluster import layer_groups
from ..codegen import donation, native_call
from ..compile import background, deferred, heap, parallel, routes, shape_generic
from ..compile.routes import Route
from ..lowering import lowering_function
from ..native import _C
from ..observe import metrics, progress, syncs
from . import cuda_graphs, numerics_check

prepare_group = lowering_function("prepare_group")  # a numerics-check case localises its stage with it


class TorchScriptExecutable:
    """Runs a fusion group's subgraph with the TorchScript graph executor;
    each run is counted by ``count`` (the name): a fallback by default, a run
    while compiling (``metrics.count_interpreted_group_call``), or nothing
    (None: a setup graph's group, nothing worth compiling). ``strides``
    (per output, None: as TorchScript gives it) copies outputs into the
    layouts the group's code will give them: the groups after it then see
    the inputs they will see once it runs generated code."""

    def __init__(self, graph: torch._C.Graph, name: str, count=metrics.count_fallback_group_call,
                 strides: list | None = None):
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
        self.strides = strides

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.count is not None:
            self.count(self.name)
        out = self.function(*inputs)
        out = [out] if self.num_outputs == 1 else list(out)
        if self.strides is not None:
            out = [_with_strides(t, s) for t, s in zip(out, self.strides)]
        for k, j in self.shared:
            out[k] = out[j]
        return out


def _with_strides(t, strides: tuple | None):
    if strides is None or not isinstance(t, torch.Tensor) or t.stride() == strides:
        return t
    try:
        return in_layout(t, strides)
    except RuntimeError:  # a layout no copy can write (overlapping other than an expand's): as it is
        return t


def in_layout(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``t``'s values in a tensor of ``strides``. A dim of stride 0 (an
    expand's) holds one value: its first. Raises for other overlapping layouts."""
    broadcast = [d for d, (n, st) in enumerate(zip(t.shape, strides)) if st == 0 and n > 1]
    base = torch.empty_strided([1 if d in broadcast else n for d, n in enumerate(t.shape)], strides,
                               dtype=t.dtype, device=t.device)
    source = t
    for d in broadcast:
        source = source.narrow(d, 0, 1)
    return base.copy_(source).expand(t.shape)


def _layout_moves(inputs: list[torch.Tensor], expected: list[tuple]) -> list[tuple[int, tuple]] | None:
    """(position, strides) per input to copy into the layout ``expected``
    ((shape, strides, dtype, device) per input) gives it; None if sizes,
    dtypes or devices differ or a copy cannot write that layout."""
    if len(expected) != len(inputs):
        return None
    moved = []
    for i, (t, (shape, strides, dtype, device)) in enumerate(zip(inputs, expected)):
        if (t.shape, t.dtype, t.device) != (shape, dtype, device):
            return None
        if t.stride() != strides:
            moved.append((i, strides))
    try:
        for i, strides in moved:
            in_layout(inputs[i], strides)
    except RuntimeError:  # a layout no copy can write: compile for these inputs instead
        return None
    return moved


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


def _raised_by_a_warning_filter(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it came from is a Warning (raised as
    an error by a warnings filter)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, Warning):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


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
    """A group's code compiling elsewhere: the group runs in TorchScript until
    ``future`` is done. On the background thread, a shape-generic form (the
    future's result: the code, or None when that compile failed and the
    static form is to be compiled); ``deferred``, a static compile left to
    its graph's flush (``parallel_compile``; None: it failed)."""
    future: Future
    started_here: bool  # this group's sizes asked for it (else it waits on its family's)
    deferred: bool = False
    strides: list | None = None  # the outputs' in the code to come (TorchScriptExecutable)
    compiled_for: list | None = None  # deferred: (shape, strides, dtype, device) of the inputs the code takes


# Deferred compiles' guessed input layouts (GroupExecutable._adapt_layouts)
# by the group's structure and configuration, with the code: the same group
# bound in a later graph (a step that traces another graph around the same
# groups: a running loss's first add, graph_clusterer.h) adapts as well,
# instead of compiling for the layouts generated code gives.
_layout_guesses: dict[tuple[str, str], tuple[list, "_Compiling", object, str]] = {}
# the latest Config.memory_cache_entries: a guess serves the graph after its compile started


def _remember_layout_guess(key: tuple[str, str], guess: tuple) -> None:
    _layout_guesses.pop(key, None)  # re-inserted: the newest
    _layout_guesses[key] = guess
    while len(_layout_guesses) > config.current.memory_cache_entries:
        del _layout_guesses[next(iter(_layout_guesses))]


class GroupExecutable:
    def __init__(self, graph: torch._C.Graph, name: str, cfg: config.Config, describe: str, num_ops: int):
        self.graph = graph.copy()
        # An unused size constant would still be one the generic plan must explain
        torch._C._jit_pass_dce(self.graph)
        self.name = name
        self.num_ops = num_ops
        self.cfg = cfg
        self.describe = describe  # the group's ops and source lines, for messages
        self.cache_key = None
        self.layout = None  # TensorGuards of the inputs the current code was compiled for
        self._layouts: list[tuple[TensorGuards, str]] = []  # (guard, cache key) per layout seen
        self._family = None  # group_key.family(graph), computed at the first compile
        self._graph_structure = None  # see _structure
        # The input layouts a deferred compile's code took (parallel_compile), until another layout came.
        self._guessed_layouts: list[tuple] | None = None
        self._probe_next = False  # the code's next run probes it (_call_code)
        self._moves: list[tuple[int, tuple]] = []  # (input, strides) copied into the code's layout (_adapt_layouts)
        # The current code offered to the C++ CompiledGroup (native_call),
        # cleared whenever the code changes.
        self.native = _C.NativeEntrySlot()
        # cuda_graphs: runs of the current code left before its capture
        # (0: never), set by _use for each new code
        self._capture_after = 0
        self._graphed = None  # the current code as a CUDA graph, once captured
        self._run = self._first_run
        parallel.bound(name)

    @property
    def _run(self):
        return self._code

    @_run.setter
    def _run(self, code):
        self._code = code
        self.native.clear()
        self._graphed = None
        self._runs_to_capture = self._capture_after

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._run(inputs)

    def offer_donation(self, positions) -> list[int]:
        """Before the first run the C++ binder offers the inputs only this group
        reads (lazy_backend/memory/buffer_donation.h); the code may write outputs into
        those accepted (lazy_mlir.codegen.donation), which become part of the group's
        configuration, hence of its cache key."""
        if not self.cfg.donate_buffers or not positions:
            return []
        if cuda_graphs.wanted(self.cfg):
            return []
        accepted = tuple(sorted(int(k) for k in positions))
        self.cfg = dataclasses.replace(self.cfg, donated_inputs=accepted)
        return list(accepted)

    def _first_run(self, inputs):
        if self.cfg.donated_inputs:  # before the cache key: positions no output can be written into
            kept = tuple(k for k in self.cfg.donated_inputs if k < len(inputs) and donation.writable(inputs[k]))
            self.cfg = dataclasses.replace(self.cfg, donated_inputs=kept)
        with syncs.deferring_warnings():
            try:
                return self._for_layout(inputs)
            finally:
                parallel.ran_first(self.name)  # the graph's last group: its deferred compiles run

    def _for_layout(self, inputs, count_miss=True):
        """First run, or inputs unlike those the current code was compiled for:
        LTC's graph hash fixes shapes and dtypes but not strides (a
        channels_last input), and Inductor's code asserts them. Runs inside
        the graph's execution: warnings the user's filter makes errors wait
        for the next mark_step (syncs.deferring_warnings)."""
        with syncs.deferring_warnings():
            return self._compile_for_layout(inputs, count_miss)

    def _compile_for_layout(self, inputs, count_miss):
        new_layout = False
        for guard, key in self._layouts:
            if guard.check(*inputs):
                break
        else:
            if self._adapt_layouts(inputs) or self._adopt_layout_guess(inputs):
                return self._run(inputs)
            guard, key = layout_guard(inputs), self._key_of(inputs)
            if self._adopt_stored_adaptation(inputs, guard, key):
                return self._run_new_code(inputs)
            self._layouts.append((guard, key))
            new_layout = True
        self.layout, self.cache_key = guard, key
        self._use(self._lowered_for(inputs, count_miss))
        if new_layout:  # once per layout, not per switch between known ones (a trim costs page faults after it)
            heap.give_back()  # what the compile or load (and a capture's tracing before it) freed
        return self._run_new_code(inputs)

    def _run_new_code(self, inputs):
        try:
            return self._run(inputs)
        except Exception as exc:  # noqa: BLE001 - at O1 code that fails its first run falls back
            if self.lowered is None or self.cfg.level == "O2":
                raise
            report_failure(self.name, self.describe, exc)
            self._use(None)  # else every later step would fail the same way
            return self._run(inputs)

    def _adapt_layouts(self, inputs) -> bool:
        """Code compiled while its graph ran in TorchScript (parallel_compile)
        took the layouts TorchScript gave its inputs, copied into those the
        code before it was to return; where that code returns another layout
        of the same sizes (Inductor lays out a view of an intermediate its
        own way), the group copies those inputs into the layouts its code
        takes rather than compiling again. Once, for the layout that first
        came: any other is a variant like any other."""
        expected, self._guessed_layouts = self._guessed_layouts, None
        if expected is None or self.lowered is None:
            return False
        moved = _layout_moves(inputs, expected)
        if not moved:
            return False
        metrics.count_cache("layout_adapted")
        # the code's guard admits inputs in these layouts; _call_code moves them (C++ too, native_entry.h)
        self.layout, self._moves = layout_guard(inputs), moved
        if not self.cfg.dump_dir:  # a later process finds the code by these layouts (_adopt_stored_adaptation)
            compile_cache.store_adaptation(self._key_of(inputs), self.cache_key, moved, self.cfg)
        return True

    def _adopt_stored_adaptation(self, inputs, guard, key) -> bool:
        """Inputs in layouts that an earlier run (another process) adapted
        to this group's code (_adapt_layouts): that code, found by these
        layouts' ``key``, with the same moves, instead of a compile. False
        when none was stored, or its code is no longer in the cache."""
        stored = None if self.cfg.dump_dir else compile_cache.adaptation(key, self.cfg)
        if stored is None:
            return False
        code_key, moves = stored
        # what a lookup reads of the inputs: the code's layouts, and the 0-d values (never moved)
        code_inputs = list(inputs)
        for i, strides in moves:
            code_inputs[i] = torch.empty_strided(inputs[i].shape, strides, dtype=inputs[i].dtype,
                                                 device=inputs[i].device)
        found = compile_cache.lookup(code_key, code_inputs, self.name, self.cfg, count_miss=False)
        if found is None:
            return False
        metrics.count_cache("layout_adapted")
        self.cache_key = code_key
        self._use(self._lowered_for(code_inputs, found=found))
        self.layout, self._moves = guard, moves
        return True

    def _in_code_layouts(self, inputs):
        if not self._moves:
            return inputs
        inputs = list(inputs)
        for i, strides in self._moves:
            inputs[i] = in_layout(inputs[i], strides)
        return inputs

    def _structure(self) -> str:
        """group_key.structure of the graph, once (~0.1 s per 1000 nodes)."""
        if self._graph_structure is None:
            self._graph_structure = group_key.structure(self.graph)
        return self._graph_structure

    def _key_of(self, inputs) -> str:
        """The cache key of this group's code compiled for inputs like these."""
        return group_key.group_key(self.graph, inputs, self.cfg.key(), self._structure())

    def _structure_key(self) -> tuple[str, str]:
        return self._structure(), self.cfg.key()

    def _adopt_layout_guess(self, inputs) -> bool:
        """At the first run: the code another graph's copy of this group
        compiled deferred, adapted to these inputs' layouts as that copy
        would be (_adapt_layouts)."""
        if self._layouts or not _layout_guesses or self.cfg.dump_dir:  # dumps show every group's own lowering
            return False
        guess = _layout_guesses.get(self._structure_key())
        if guess is None or not _layout_moves(inputs, guess[0]):
            return False  # other sizes, or the layouts the code took: looked up as any group
        compiled_for, compiling, layout, key = guess
        if not compiling.future.done() or compiling.future.result() is None:
            return False  # still compiling, or failed: its copy will not adapt either
        self._use(compiling.future.result())
        self.layout, self.cache_key, self._guessed_layouts = layout, key, compiled_for
        return self._adapt_layouts(inputs)

    def _guarded(self, inputs):
        if not self.layout.check(*inputs):
            return self._for_layout(inputs)
        return self._call_code(inputs)

    def _call_code(self, given):
        inputs = self._in_code_layouts(given)
        if self._graphed is not None:
            return self._graphed(inputs)
        if self._runs_to_capture:
            self._runs_to_capture -= 1
            if not self._runs_to_capture:
                self._graphed = cuda_graphs.capture(self.name, self.lowered.run, inputs)
                if self._graphed is not None:
                    return self._graphed(inputs)
        if not self._probe_next:
            return self.lowered.run(inputs)
        self._probe_next = False
        plan = self.lowered.native if self.cfg.native_calls else None
        if plan is not None:  # read from the cache as a library: called as one, Inductor never loaded
            return self.native.call(given) if self._offer_native(plan, given) else self.lowered.run(inputs)
        # The code's first run: it also tells whether C++ may call the code
        # itself from the next run on (native_call), for inputs like these.
        outputs, plan = native_call.probe(self.lowered.run, inputs)
        if plan is not None and self._offer_native(plan, given):
            self.lowered.native = plan
            compile_cache.store_native(self.lowered, plan, self.cfg)
        return outputs

    def _offer_native(self, plan: native_call.Plan, inputs) -> bool:
        """Offers the code to the C++ CompiledGroup, for inputs like these
        (before their moves into the code's layouts, which C++ makes too);
        False (a warning) when the library is not what native_entry.h expects."""
        try:
            # C++ checks the scalars' tensors as ScalarGuards does: the
            # very tensors seen now, unchanged
            self.native.set(plan.library, plan.arguments, plan.num_results, plan.outputs, plan.aliases, inputs,
                            [i for i, _ in self.lowered.guards], self._moves)
        except RuntimeError as exc:  # Python calls it
            warnings.warn(f"lazy_mlir: {self.name}'s code is called through Python: {exc}", RuntimeWarning,
                          stacklevel=3)
            return False
        return True

    def _use(self, lowered):
        self._moves = []
        compiled = lowered is not None and not isinstance(lowered, _Compiling)
        self._probe_next = compiled and not lowered.collective_bytes
        graphed = compiled and cuda_graphs.eligible(self.cfg, lowered, self.graph)
        self._capture_after = cuda_graphs.RUNS_BEFORE_CAPTURE if graphed else 0
        if isinstance(lowered, _Compiling):
            self.lowered, self._compiling = None, lowered
            self._interpreter = TorchScriptExecutable(self.graph, self.name, metrics.count_interpreted_group_call,
                                                      lowered.strides)
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
        if self.cfg.check:
            self._run = self._checked_first_run(self._run)

    def _checked_first_run(self, code_run):
        """``code_run``, its first run also checked against TorchScript on
        copies of the same inputs (numerics_check): later runs call it alone;
        where the outputs disagree, the group runs in TorchScript from then on."""
        def first_run(inputs):
            self._run = code_run
            # copies taken before the code runs: it may write outputs into donated inputs
            originals = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
            interpreter = TorchScriptExecutable(self.graph, self.name, count=None)
            reference = interpreter(list(originals))
            outputs = code_run(inputs)
            mismatches, floors = numerics_check.differences_beyond_noise(
                originals, reference, interpreter, numerics_check.graph_float(self.graph, [*originals, *reference]),
                lambda floors: numerics_check.compare(self.graph, outputs, reference, floors))
            if not mismatches:
                metrics.count_check(self.name, None)
                return outputs
            case, stage = numerics_check.save_case(self.graph, originals, reference, floors, self.name, self.cfg,
                                                       prepare_group)
            text = numerics_check.report(self.name, self.describe, mismatches, case, stage)
            metrics.count_check(self.name, text)
            if self.cfg.level == "O2":
                raise GroupLoweringError(text)
            reason = "numerics check: generated code disagrees with TorchScript" + (f" (case: {case})" if case else "")
            metrics.record_group_failure(self.name, self.describe, reason)
            if self.lowered is not None and self.cache_key is not None:
                compile_cache.discard_code(self.cache_key, self.lowered, reason, self.cfg)
            warnings.warn(text, RuntimeWarning, stacklevel=1)
            self._use(None)
            return reference
        return first_run

    def _while_compiling(self, inputs):
        compiling = self._compiling
        if not compiling.future.done():
            return self._interpreter(inputs)
        self._compiling = self._interpreter = None
        if compiling.deferred:
            self._use(compiling.future.result())
            self._guessed_layouts = compiling.compiled_for
            return self._run_new_code(inputs)
        generic = None if compiling.future.exception() is not None else compiling.future.result()
        if generic is not None and compiling.started_here:
            self.add_variant(inputs, generic.guards)
        # as at a first run: the generic code if it admits these sizes, else a
        # compile (its cache miss was counted when the background compile began)
        return self._for_layout(inputs, count_miss=False)

    def _checked(self, inputs):
        if not self.layout.check(*inputs):
            return self._for_layout(inputs)
        if not self._scalars.hold(inputs):
            # A scalar whose value was baked in (a shape depends on it) changed:
            # another variant of this layout's code, which takes the same moves
            moves = self._moves
            self._use(self._lowered_for(self._in_code_layouts(inputs)))
            self._moves = moves if self.lowered is not None else []
            return self._run(inputs)
        if self.lowered.collective_bytes:
            metrics.count_collectives(self.lowered.collective_bytes)
        return self._call_code(inputs)

    def _lowered_for(self, inputs, count_miss=True, found=None):
        """The code for ``inputs`` (``found``: what the cache already gave for them)."""
        if self._family is None:
            self._family = group_key.family(self.graph)
        lowered = found if found is not None else self.cached(inputs, count_miss)
        generic = None
        sighting = shape_generic.sight(self.graph, inputs, self.cfg)  # also on a hit: sizes seen count
        if lowered is None and sighting is not None:
            lowered = generic = shape_generic.lookup(sighting, inputs, self.name, self.cfg)
            if generic is not None:
                compile_cache.store(self.cache_key, generic, self.cfg)  # in memory: no artefacts
        if lowered is None:
            if self.failed_before():
                return None
            choice = routes.choose(self.cfg, self.name, inputs, sighting)
            if choice.route is Route.WAIT:  # a third size waits for the second's code
                return _Compiling(choice.pending, started_here=False)
            if choice.route is Route.BACKGROUND:
                return self._in_background(inputs, sighting, choice.planned)
            if choice.route is Route.DEFERRED:
                return self._deferred(inputs, sighting)
            with compile_cache.exclusive(self.cache_key, self.cfg, self._waiting):
                # another process (a rank) may have compiled it meanwhile, or failed to
                lowered = self.cached(inputs, count_miss=False)
                if lowered is None:
                    if self.failed_before():
                        return None
                    self._before_compile(inputs, sighting)
                    lowered = self._compile(inputs, choice.route, sighting)
                    if lowered is None:
                        return None
                    compile_cache.store(self.cache_key, lowered, self.cfg)
        if sighting is not None:
            shape_generic.observe(sighting)
        if generic is None:  # a size served by generic code is no new variant
            self.add_variant(inputs, lowered.guards)
        return lowered

    def cached(self, inputs, count_miss):
        # Dumps show every group's real lowering: with dump_dir set, no cache serves it.
        if self.cfg.dump_dir:
            return None
        return compile_cache.lookup(self.cache_key, inputs, self.name, self.cfg, count_miss)

    def failed_before(self) -> bool:
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

    def _compile(self, inputs, route: Route, sighting):
        """The code, compiled in the step by ``route`` (GENERIC, ISOLATED or
        IN_PROCESS); None: it failed (reported)."""
        start = time.perf_counter()
        if self.cfg.progress:
            print(f"lazy_mlir: compiling {self.name} ({self.num_ops} ops) ...", file=sys.stderr, flush=True)
            layer_groups.print_compile_hint()
        try:
            with progress.still_compiling(f"{self.name} ({self.num_ops} ops)", self.cfg.progress):
                lowered = routes.compile_in_step(route, self.graph, inputs, self.name, self.cfg, sighting)
        except Exception as exc:  # noqa: BLE001 - O1 falls back to TorchScript, O2 fails
            self.compile_failed(exc)
            return None
        if self.cfg.progress:
            print(f"lazy_mlir: compiled {self.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        return lowered

    def _before_compile(self, inputs, sighting=None) -> None:
        """Explains the compile to come (recompiles), and why it is for these
        sizes only where the group was seen at others."""
        recompiles.before_compile(self._family, self.graph, inputs, self.name, self.describe, self.cfg,
                                  self.cfg.key(), shape_generic.refusal(self.graph, sighting, inputs))

    def add_variant(self, inputs, guards) -> None:
        """Records the variant now serving these inputs (recompiles)."""
        recompiles.add_variant(self._family, self.graph, self.name, inputs, guards, self.describe, self.cfg,
                               self.cfg.key())
        shape_generic.note_baked(self.graph, inputs, self.cfg, guards)

    def compile_failed(self, exc: Exception) -> None:
        # A warning that the user's filter raised as an error (-W error: a
        # deprecation inside Inductor) says nothing about the group: not
        # remembered on disk, where it would fail every later process too.
        compile_cache.store_failure(self.cache_key, f"{type(exc).__name__}: {exc}", self.cfg,
                                    on_disk=not _raised_by_a_warning_filter(exc))
        self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """A group that cannot be lowered: O1 runs it in TorchScript, O2 fails."""
        if self.cfg.level == "O2":
            metrics.record_group_failure(self.name, self.describe, f"{type(exc).__name__}: {exc}")
            raise GroupLoweringError(f"lazy_mlir O2: the step failed to compile ({type(exc).__name__}: {exc}); "
                                     f"group ops: {self.describe}. Use level=\"O1\" to run such groups in "
                                     "TorchScript.") from exc
        report_failure(self.name, self.describe, exc)

    def _in_background(self, inputs, sighting, planned):
        """Route BACKGROUND: the shape-generic form compiles on the worker
        thread while the group runs in TorchScript (a ``_Compiling``)."""
        self._before_compile(inputs)
        if self.cfg.progress:
            print(f"lazy_mlir: {self.name} seen at other sizes: compiling it shape-generic in the background "
                  f"({self.num_ops} ops); it runs in TorchScript until then", file=sys.stderr, flush=True)
        example = _snapshot(inputs)
        compile_generic = routes.compile_generic
        return _Compiling(background.submit(sighting.family, lambda: compile_generic(
            self.graph, example, self.name, self.cfg, sighting, planned, in_background=True)), started_here=True)

    def _deferred(self, inputs, sighting):
        """Route DEFERRED: during its graph's first execution, a static compile
        waits for the graph's other groups, to generate code beside theirs
        (``parallel``): a ``_Compiling`` for it. The group is lowered to FX here (a failure is reported as
        in any compile, and it runs in TorchScript), which tells the layouts
        of the outputs its code will return."""
        self._before_compile(inputs, sighting)
        if sighting is not None:
            shape_generic.observe(sighting)  # the graph's later groups see these sizes, as after a compile
        job = deferred.DeferredCompile(self, _snapshot(inputs))
        leader = parallel.job_for(self.name, self.cache_key)
        if leader is not None:
            job.follow(leader)  # alike to a group deferred before it in this graph: compiled once
        elif not job.prepare():  # failed (reported): TorchScript from now on
            failed = Future()
            failed.set_result(None)
            return _Compiling(failed, started_here=True, deferred=True)
        compiling = _Compiling(parallel.defer(self.name, job), started_here=True, deferred=True,
                               strides=job.output_strides,
                               compiled_for=[(t.shape, t.stride(), t.dtype, t.device) for t in job.inputs])
        _remember_layout_guess(self._structure_key(), (compiling.compiled_for, compiling, self.layout, self.cache_key))
        return compiling


def _snapshot(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """What a later compile reads of a group's inputs: the values of 0-d ones,
    copied (later steps may overwrite them), and sizes and strides, held by a
    view of each (TorchScript resizes an out= input in place, as arange's:
    the compile must see the sizes LTC traced)."""
    return [t.clone() if t.dim() == 0 else t.as_strided(t.shape, t.stride(), t.storage_offset()) for t in inputs]
