"""Shape-generic groups: one compile serves a group at every size
("automatic dynamic", ``Config.dynamic``).

LTC bakes sizes into a step's graph, so a second sequence length or batch
size hands over groups that differ from the first size's only in their size
constants (view/expand sizes, slice bounds: ``ts_to_fx.size_constants``) and
their inputs' sizes. The first size compiles static code. At a second size
the group is compiled once more, shape-generic: every input dim whose size
changed becomes a symbol, and every size constant that changed is written as
an expression of those symbols that explains both sizes (``s``, ``s*k``,
``s//k``, ``(s+k-1)//k``, ``s+k``, ``s*t*k``...). Inductor then generates
code for any size its shape guards admit.

Serving a later size is checked, never assumed: the group's structure (its
size constants left out), dtypes, devices and aliasing must be the same; every
size constant must equal its expression at the new sizes (the others their
old value); static dims and layouts must be those compiled for; and the sizes
must pass Inductor's shape guards (which keep sizes 0 and 1 out, as Dynamo's
do). Otherwise the group compiles as before. Groups with collectives (ZeRO)
stay static: their passes plan memory by size.

With the persistent cache on, generic variants are stored too (per family,
see ``_store``): a later process serves any size they admit without
compiling, at the cost of loading the artefact when a variant first serves.

Why one module of ~560 lines: sightings, plans, lookups and the generic
compile share one index of families and their variants (memory and disk).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import operator
import pickle
import sys
import warnings
from typing import TYPE_CHECKING

import torch

from .. import config
from ..cache import compile_cache, group_key, recompiles
from ..lowering import lowering_function
from ..lowering.lowered_group import LoadOnFirstCall, LoweredGroup
from ..lowering.size_constants import size_constants
from ..observe import metrics, syncs

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

lower_group = lowering_function("lower_group")
load_group = lowering_function("load_group")
fake_inputs_of = lowering_function("fake_inputs_of")


@dataclasses.dataclass(frozen=True)
class SizeExpr:
    """``((prod(input sizes at dims) * scale + shift) // divisor + offset)
    * prod(input sizes at times)``."""
    dims: tuple[tuple[int, int], ...]  # (input index, dim)
    scale: int = 1
    divisor: int = 1
    offset: int = 0
    shift: int = 0  # divisor - 1: a ceiling quotient (padded strided convolutions)
    times: tuple[tuple[int, int], ...] = ()  # B in B*(T-1): a shifted sequence flattened with its batch

    def value(self, shapes) -> int:
        return (self.value_of(math.prod(shapes[i][d] for i, d in self.dims))
                * math.prod(shapes[i][d] for i, d in self.times))

    def value_of(self, product: int) -> int:
        return (product * self.scale + self.shift) // self.divisor + self.offset

    def to_fx(self, converter):
        """Its FX nodes in ``ts_to_fx``'s converter (sym_size, operator calls)."""
        node = converter.sym_size(*self.dims[0])
        for i, d in self.dims[1:]:
            node = converter.int_call(operator.mul, node, converter.sym_size(i, d))
        if self.scale != 1:
            node = converter.int_call(operator.mul, node, self.scale)
        if self.shift:
            node = converter.int_call(operator.add, node, self.shift)
        if self.divisor != 1:
            node = converter.int_call(operator.floordiv, node, self.divisor)
        if self.offset:
            node = converter.int_call(operator.add, node, self.offset)
        for i, d in self.times:
            node = converter.int_call(operator.mul, node, converter.sym_size(i, d))
        return node

    def __str__(self):
        text = "*".join(f"in{i}.size({d})" for i, d in self.dims)
        text += f"*{self.scale}" if self.scale != 1 else ""
        text = f"({text}+{self.shift})" if self.shift else text
        text += f"//{self.divisor}" if self.divisor != 1 else ""
        text += f"{self.offset:+d}" if self.offset else ""
        return f"({text})*" + "*".join(f"in{i}.size({d})" for i, d in self.times) if self.times else text


def explain(values: list[int], sizes: list[tuple[tuple[int, int], list[int]]]) -> SizeExpr | None:
    """The simplest expression that gives ``values`` (one per observation)
    from the varying ``sizes`` ((input, dim), one value per observation): a
    multiple or an exact quotient of one size or of a product of two or
    three (``B*T``; ``B*H*W//16``, a CNN's pixels flattened), else a ceiling quotient of one size (``(s+7)//8``: three
    padded stride-2 convolutions, which two sizes divisible by 8 read as
    ``s//8`` and a third size tells apart), else a quotient of one size
    plus a constant, else an integer affine function of one size (``2*s -
    2``: a shifted sequence flattened with its batch of 2), else a quotient
    of a product plus a constant (``H*W//256 + 1``: a ViT's patches and its
    class token; after the affine, which a square image's two sizes fit
    with an integer slope only by chance, while ``L*L//12 + 9`` fits GPT-2's
    ``2*L - 2`` at L = 8 and 16 and not at 12), else one size times an affine
    function of another (``B*(T-1)``, the batch varying too). It must fit
    every observation; two always fit some affine function, so whether it
    holds at a new size is checked there (``GenericGroup.admits``)."""
    singles = [((dim,), seen) for dim, seen in sizes]
    products = [(tuple(dim for dim, _ in group), [math.prod(values) for values in zip(*(seen for _, seen in group))])
                for n in (2, 3) for group in itertools.combinations(sizes, n)]
    tries = [(_multiple, base) for base in singles + products] + [(_quotient, base) for base in singles + products]
    tries += [(_ceiling_quotient, base) for base in singles] + [(_offset_quotient, base) for base in singles]
    tries += [(_affine, base) for base in singles] + [(_offset_quotient, base) for base in products]
    # per observation, {input: {dim: size}} for the varying sizes: indexed as SizeExpr.value's shapes
    observations = [{} for _ in values]
    for (i, d), seen in sizes:
        for observation, size in zip(observations, seen):
            observation.setdefault(i, {})[d] = size
    for form, (dims, seen) in tries:
        candidate = form(dims, seen, values)
        if candidate is not None and _fits(candidate, observations, values):
            return candidate
    for (factor, factor_seen), (dims, seen) in itertools.permutations(singles, 2):
        if all(f and v % f == 0 for f, v in zip(factor_seen, values)):
            inner = _affine(dims, seen, [v // f for f, v in zip(factor_seen, values)])
            candidate = inner and dataclasses.replace(inner, times=factor)
            if candidate and _fits(candidate, observations, values):
                return candidate
    return None


def _fits(candidate: SizeExpr, observations: list[dict], values: list[int]) -> bool:
    return all(candidate.value(shapes) == v for shapes, v in zip(observations, values))


def _multiple(dims, seen: list[int], values: list[int]) -> SizeExpr | None:
    return SizeExpr(dims, scale=values[0] // seen[0]) if seen[0] and values[0] % seen[0] == 0 and values[0] else None


def _affine(dims, seen: list[int], values: list[int]) -> SizeExpr | None:
    pairs = [(x, v) for x, v in zip(seen, values) if x != seen[0]]
    if not pairs or (pairs[0][1] - values[0]) % (pairs[0][0] - seen[0]):
        return None
    scale = (pairs[0][1] - values[0]) // (pairs[0][0] - seen[0])
    return SizeExpr(dims, scale=scale, offset=values[0] - scale * seen[0]) if scale else None


def _quotient(dims, seen: list[int], values: list[int]) -> SizeExpr | None:
    if not values[0] or seen[0] % values[0] or seen[0] // values[0] < 2:
        return None
    return SizeExpr(dims, divisor=seen[0] // values[0])


def _ceiling_quotient(dims, seen: list[int], values: list[int]) -> SizeExpr | None:
    """``ceil(s / d)``, with ``d`` the quotient at an observation it divides."""
    for x, v in zip(seen, values):
        if v and not x % v and x // v >= 2:
            d = x // v
            if all(-(-y // d) == w for y, w in zip(seen, values)):
                return SizeExpr(dims, divisor=d, shift=d - 1)
    return None


def _offset_quotient(dims, seen: list[int], values: list[int]) -> SizeExpr | None:
    """``s // d + c``, ``d`` from two observations' differences."""
    pairs = [(x, v) for x, v in zip(seen, values) if x != seen[0]]
    if not pairs or pairs[0][1] == values[0] or (pairs[0][0] - seen[0]) % (pairs[0][1] - values[0]):
        return None
    d = (pairs[0][0] - seen[0]) // (pairs[0][1] - values[0])
    return SizeExpr(dims, divisor=d, offset=values[0] - seen[0] // d) if d >= 2 else None


@dataclasses.dataclass
class Symbolic:
    """What ``lower_group`` needs to compile the generic form."""
    fake_mode: FakeTensorMode
    fakes: list
    size_exprs: dict[int, object]  # size constant ordinal -> SizeExpr or list of int | SizeExpr
    scalar_exprs: dict[int, SizeExpr]  # 0-d integer input -> the size its value is


@dataclasses.dataclass
class GenericGroup:
    lowered: LoweredGroup | None        # None until a variant read from disk serves its first size
    shapes: list[tuple[int, ...]]       # the sizes it was compiled at
    strides: list[tuple[int, ...]]
    dynamic: set[tuple[int, int]]       # (input, dim) that are symbols
    template: list                      # per size constant: its value with SizeExprs
    scalar_exprs: dict[int, SizeExpr]   # 0-d integer inputs that hold a size
    guard_code: str | None              # Inductor's shape guards over L['t<i>']
    guards: list[tuple[int, object]]    # scalar inputs whose values are baked into the code
    disk_key: str | None = None         # its entry in the cache folder, if stored

    def admits(self, constants: list, inputs: list[torch.Tensor]) -> bool:
        shapes = [tuple(t.shape) for t in inputs]
        if len(inputs) != len(self.shapes):
            return False
        for i, (t, shape, stride) in enumerate(zip(inputs, self.shapes, self.strides)):
            if len(t.shape) != len(shape):
                return False
            if any((i, d) not in self.dynamic and t.shape[d] != shape[d] for d in range(len(shape))):
                return False
            dynamic = any((i, d) in self.dynamic for d in range(len(shape)))
            if (not t.is_contiguous()) if dynamic else tuple(t.stride()) != stride:
                return False
        if len(constants) != len(self.template):
            return False
        for value, generic in zip(constants, self.template):
            if _instantiate(generic, shapes) != value:
                return False
        if any(inputs[i].item() != e.value(shapes) for i, e in self.scalar_exprs.items()):
            return False
        if not all(compile_cache.same_scalar(inputs[i].item(), v) for i, v in self.guards):
            return False  # a scalar baked into the code
        return self.guard_code is None or _guard_evaluator().evaluate_guards_expression(self.guard_code, inputs)


@functools.cache
def _guard_evaluator():
    """A ShapeEnv to evaluate guard code (it keeps no state of its own);
    made on first use, as it imports sympy."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return ShapeEnv()


def _instantiate(generic, shapes):
    if isinstance(generic, SizeExpr):
        return generic.value(shapes)
    if isinstance(generic, list):
        return [_instantiate(g, shapes) for g in generic]
    return generic


@dataclasses.dataclass
class Sighting:
    """A group at one set of sizes, read once per compile miss: its family,
    size constants, input sizes and integer scalar inputs' values."""
    family: str
    constants: list
    shapes: list[tuple[int, ...]]
    scalars: dict[int, int]
    execution: int = 0  # the graph execution it was seen in (syncs.execution)


_observed: dict[str, list[Sighting]] = {}  # family -> sizes seen (the first MAX_OBSERVATIONS)
_generic: dict[str, list[GenericGroup]] = {}
_families_read: set[str] = set()  # families whose variants in the cache folder were read
_given_up: dict[str, str] = {}  # family -> why its generic compile failed: static from then on
_baked: dict[str, set[int]] = {}  # family -> scalar inputs its compiled variants baked in
MAX_OBSERVATIONS = 16


def family(graph: torch._C.Graph, inputs: list[torch.Tensor], cfg: config.Config) -> str:
    """Everything a generic variant must share with a group, sizes aside."""
    signature = tuple((str(t.dtype), str(t.device), t.dim(), same) for (_, _, _, _, same), t
                      in zip(group_key.input_signature(inputs), inputs))
    # Generic code never writes into its inputs (group_lowering donates in
    # static code only): groups of one family share it whatever they donate.
    shared = dataclasses.replace(cfg, donated_inputs=()).key() if cfg.donated_inputs else cfg.key()
    parts = (group_key.structure(graph, abstract_sizes=True), signature, shared, group_key.environment_id())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def enabled(cfg: config.Config) -> bool:
    return cfg.dynamic == "auto" and "zero-" not in (cfg.pipeline or "") and not cfg.dump_dir


def sight(graph: torch._C.Graph, inputs: list[torch.Tensor], cfg: config.Config) -> Sighting | None:
    """What the other functions need of a group at a compile miss; None when
    shape-generic groups are off."""
    if not enabled(cfg):
        return None
    return Sighting(family(graph, inputs, cfg), size_constants(graph), [tuple(t.shape) for t in inputs],
                    _integer_scalars(inputs), syncs.execution)


def lookup(sighting: Sighting, inputs: list[torch.Tensor], name: str, cfg: config.Config) -> LoweredGroup | None:
    """A generic variant that serves ``inputs``'s sizes (counted "generic_hit";
    one read from the cache folder also "generic_disk_hit"). Where its code
    was called from C++ at these very sizes before (a native plan stored
    under ``sized_key``), that plan, and the variant is loaded through
    Python (Inductor's artefact) only for a run C++ does not take."""
    _read_stored(sighting.family, cfg)
    for variant in list(_generic.get(sighting.family, ())):
        if variant.admits(sighting.constants, inputs):
            sized = sized_key(variant, inputs)
            native = compile_cache.generic_native_plan(sized, cfg) if sized is not None else None
            if native is not None:
                if variant.lowered is None:
                    metrics.count_cache("generic_disk_hit")
                metrics.count_cache("generic_hit")
                return LoweredGroup(LoadOnFirstCall(_python_run(variant, sighting.family, name, cfg)),
                                    list(variant.guards), native=native, disk_key=sized)
            if variant.lowered is None and not _load(variant, sighting.family, inputs, name, cfg):
                continue
            metrics.count_cache("generic_hit")
            # a copy per group and size: the native plan its probe finds is stored for these sizes alone
            return dataclasses.replace(variant.lowered, artifacts=None, native=None, disk_key=sized)
    return None


def sized_key(variant: GenericGroup, inputs: list[torch.Tensor]) -> str | None:
    """Where a stored variant's native plan for inputs like these is kept
    (compile_cache.store_native); None for a variant not in the cache folder."""
    if variant.disk_key is None:
        return None
    return hashlib.sha256(f"{variant.disk_key}|{group_key.input_signature(inputs)!r}".encode()).hexdigest()


def _python_run(variant: GenericGroup, family: str, name: str, cfg: config.Config):
    def load(inputs):
        if variant.lowered is None and not _load(variant, family, inputs, name, cfg):
            raise RuntimeError(f"the compile cache's shape-generic entry of {name} cannot be loaded")
        return variant.lowered.run
    return load


# On disk, a family's index entry lists its variants (every GenericGroup
# field but the executable); each variant's artefacts are an entry of their
# own, read when the variant first serves a size. Two processes adding a
# variant to one index at once may lose one of them: it is compiled again.
_STORED_FIELDS = [f.name for f in dataclasses.fields(GenericGroup) if f.name != "lowered"]


def _index_key(family: str) -> str:
    return hashlib.sha256(f"generic|{family}".encode()).hexdigest()


def _variant_disk_key(family: str, fields: dict) -> str:
    """The entry of a variant's artefacts: named by every stored field that
    ``admits`` reads or the code depends on, not only the sizes it was
    compiled at. Two variants of one family compiled at the same sizes differ
    in a constant (``nll_loss``'s reduction, an int like the sizes, which the
    family leaves out: one variant keeps it, the other explains it by a size)
    and must not share an entry: one would load the other's code."""
    described = {name: (sorted(value) if isinstance(value, set) else
                        sorted(value.items()) if isinstance(value, dict) else value)
                 for name, value in sorted(fields.items()) if name != "disk_key"}
    return hashlib.sha256(f"generic|{family}|{described!r}".encode()).hexdigest()


def _store(family: str, variant: GenericGroup, artifacts: dict | None, cfg: config.Config) -> None:
    disk = compile_cache.disk_of(cfg)
    if disk is None or artifacts is None:
        return
    variant.disk_key = _variant_disk_key(family, {f: getattr(variant, f) for f in _STORED_FIELDS})
    index_key = _index_key(family)
    index = compile_cache.read_entry(disk, index_key) or {"key": index_key, "variants": []}
    index["variants"] = [v for v in index["variants"] if v["disk_key"] != variant.disk_key
                         and v["disk_key"] == _variant_disk_key(family, v)]  # older entries: see _read_stored
    index["variants"].append({f: getattr(variant, f) for f in _STORED_FIELDS})
    try:
        disk.write(variant.disk_key, pickle.dumps({"key": variant.disk_key, "artifacts": artifacts}))
        disk.write(index_key, pickle.dumps(index))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        warnings.warn(f"lazy_mlir: cannot store a shape-generic group in the cache ({exc})", RuntimeWarning,
                      stacklevel=2)


def _read_stored(family: str, cfg: config.Config) -> None:
    """Adds the family's variants stored by earlier processes (once per process)."""
    if family in _families_read:
        return
    _families_read.add(family)
    disk = compile_cache.disk_of(cfg)
    index = compile_cache.read_entry(disk, _index_key(family)) if disk is not None else None
    if index is None:
        return
    known = {v.disk_key for v in _generic.get(family, ())}
    try:
        # a variant listed under another key than its fields name (written by
        # an older lazy_mlir, which named it by its sizes alone) may find
        # another variant's code there: it is compiled again instead
        stored = [GenericGroup(lowered=None, **fields) for fields in index["variants"]
                  if fields["disk_key"] not in known and fields["disk_key"] == _variant_disk_key(family, fields)]
    except (KeyError, TypeError, AttributeError) as exc:
        disk.discard(_index_key(family), f"unreadable index of shape-generic variants: {exc}")
        return
    _generic.setdefault(family, []).extend(stored)


def _load(variant: GenericGroup, family: str, inputs: list[torch.Tensor], name: str, cfg: config.Config) -> bool:
    """Loads a stored variant's executable; False (the variant forgotten, its
    entry removed) when it cannot be."""
    disk = compile_cache.disk_of(cfg)
    entry = compile_cache.read_entry(disk, variant.disk_key) if disk is not None else None
    try:
        if entry is None:
            raise FileNotFoundError("its entry is gone")
        variant.lowered = load_group(entry["artifacts"], variant.guards, {}, inputs, name, variant.dynamic)
    except Exception as exc:  # noqa: BLE001 - a stale or broken entry: compile instead
        if entry is not None:
            disk.discard(variant.disk_key, f"cannot be loaded: {type(exc).__name__}: {exc}")
        _generic[family].remove(variant)
        return False
    metrics.count_cache("generic_disk_hit")
    return True


def seen_in_this_execution(sighting: Sighting) -> bool:
    """Whether another size of its family came in the same graph execution
    (T5's encoder and decoder attention in one step)."""
    return any(o.execution == sighting.execution for o in _observed.get(sighting.family, ()))


def observe(sighting: Sighting) -> None:
    """Remembers the sizes a family was seen at."""
    seen = _observed.setdefault(sighting.family, [])
    if len(seen) < MAX_OBSERVATIONS and all(o.shapes != sighting.shapes for o in seen):
        seen.append(sighting)


def plan(sighting: Sighting, inputs: list[torch.Tensor]):
    """(dynamic dims, size constants template, scalar input expressions) when
    the group was seen at other sizes and every size constant and integer
    scalar input that varies has an expression fitting all sizes seen; else
    None. Dims that ever varied stay symbolic (automatic dynamic)."""
    planned = _plan(sighting, inputs)
    return None if planned is None or isinstance(planned, _Refused) else planned


@dataclasses.dataclass
class _Refused:
    reason: str
    constant: int | None = None  # the ordinal of the size constant no expression gives


def refusal(graph: torch._C.Graph, sighting: Sighting | None, inputs: list[torch.Tensor]) -> str | None:
    """Why a group seen at other sizes gets no generic form (``plan``'s
    None), naming the op of a size that has no expression; None when it
    does, or was never seen at other sizes."""
    planned = sighting and _plan(sighting, inputs)
    if not isinstance(planned, _Refused):
        return None
    if planned.constant is not None:
        return f"no expression of the sizes that changed gives the size constant used by " \
               f"{recompiles.size_constant_user(graph, planned.constant)}: {planned.reason}"
    return planned.reason


def _plan(sighting: Sighting, inputs: list[torch.Tensor]):
    """``plan``'s result, or why there is none."""
    shapes = sighting.shapes
    seen = [o for o in _observed.get(sighting.family, ()) if o.shapes != shapes]
    if sighting.family in _given_up:
        return _Refused(_given_up[sighting.family])
    if not seen:
        return None
    points = seen + [sighting]
    dynamic = {(i, d) for i, shape in enumerate(shapes) for d in range(len(shape))
               if any(o.shapes[i][d] != shape[d] for o in seen)}
    small = sorted((i, d) for i, d in dynamic if shapes[i][d] < 2)
    if small:
        i, d = small[0]
        return _Refused(f"input {i} has size {shapes[i][d]} at dim {d} (0 and 1 are specialised, as in Dynamo)")
    gapped = sorted(i for i in {i for i, _ in dynamic} if not inputs[i].is_contiguous())
    if gapped:
        return _Refused(f"input {gapped[0]}, whose sizes changed, is not contiguous")
    sizes = [((i, d), [o.shapes[i][d] for o in points]) for i, d in sorted(dynamic)]
    template = []
    for k in range(len(sighting.constants)):
        values = [o.constants[k] for o in points]
        generic = _generalize(values, sizes)
        if generic is None:
            return _Refused(" -> ".join(map(str, values)), constant=k)
        template.append(generic)
    # A varying integer scalar that the static code baked in (an arange's
    # end) holds a size: it needs an expression. One the code reads at run
    # time stays an input, whatever it holds (BatchNorm's
    # num_batches_tracked counts steps; two sizes would "explain" any two
    # values).
    scalar_exprs = {}
    for i in sighting.scalars:
        values = [o.scalars[i] for o in points]
        if len(set(values)) > 1 and i in _baked.get(sighting.family, ()):
            scalar_exprs[i] = explain(values, sizes)
            if scalar_exprs[i] is None:
                return _Refused(f"no expression of the sizes that changed gives scalar input {i}: "
                                f"{' -> '.join(map(str, values))}")
    return dynamic, template, scalar_exprs


def note_baked(graph: torch._C.Graph, inputs: list[torch.Tensor], cfg: config.Config, guards) -> None:
    """Remembers which scalar inputs a compiled variant of the group baked
    into its code (its guards), for ``plan``."""
    if guards and enabled(cfg):
        _baked.setdefault(family(graph, inputs, cfg), set()).update(i for i, _ in guards)


def _generalize(values: list, sizes):
    """One size constant's generic form from its value at each observation."""
    if all(v == values[-1] for v in values):
        return values[-1]
    if isinstance(values[-1], int):
        return explain(values, sizes)
    if any(len(v) != len(values[-1]) for v in values):
        return None
    parts = [_generalize([v[k] for v in values], sizes) for k in range(len(values[-1]))]
    return None if any(p is None for p in parts) else parts


def _integer_scalars(inputs: list[torch.Tensor]) -> dict[int, int]:
    return {i: int(t.item()) for i, t in enumerate(inputs)
            if t.dim() == 0 and not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool}


def compile_generic(graph: torch._C.Graph, inputs: list[torch.Tensor], name: str, cfg: config.Config,
                    sighting: Sighting, planned) -> LoweredGroup:
    """Compiles the generic form planned by ``plan`` and registers it. Raises
    on any failure (the caller compiles the static form instead)."""
    dynamic, template, scalar_exprs = planned
    fake_mode, fakes = fake_inputs_of(inputs, dynamic)
    size_exprs = {k: g for k, g in enumerate(template) if _has_expr(g)}
    lowered = lower_group(graph, inputs, name, cfg, Symbolic(fake_mode, fakes, size_exprs, scalar_exprs))
    if lowered.collective_bytes:
        raise RuntimeError("a group with collectives stays static")
    variant = GenericGroup(lowered, [tuple(t.shape) for t in inputs], [tuple(t.stride()) for t in inputs],
                           set(dynamic), template, scalar_exprs, fake_mode.shape_env.produce_guards_expression(fakes),
                           list(lowered.guards))
    if not variant.admits(sighting.constants, inputs):
        raise RuntimeError("the generic form does not admit the sizes it was compiled at")
    _generic.setdefault(sighting.family, []).append(variant)
    # stored as a generic variant only: the static key of these sizes must not hold symbolic code twice
    artifacts, lowered.artifacts = lowered.artifacts, None
    _store(sighting.family, variant, artifacts, cfg)
    if cfg.logs("recompiles") or cfg.logs("dynamic"):
        exprs = ", ".join([f"#{k}: {_describe(g)}" for k, g in size_exprs.items()] +
                          [f"in{i}: {e}" for i, e in scalar_exprs.items()])
        print(f"lazy_mlir: {name} compiled shape-generic: symbols {sorted(dynamic)}; sizes {exprs}", file=sys.stderr)
    return dataclasses.replace(lowered, disk_key=sized_key(variant, inputs))  # as lookup gives it


def give_up(family: str, reason: str = "its generic compile failed before") -> None:
    """A family whose generic compile failed compiles every size static
    (not the same failing compile again at each new size)."""
    _given_up[family] = reason


def _has_expr(generic) -> bool:
    return isinstance(generic, SizeExpr) or (isinstance(generic, list) and any(isinstance(g, SizeExpr) for g in generic))


def _describe(generic) -> str:
    return "[" + ", ".join(map(str, generic)) + "]" if isinstance(generic, list) else str(generic)


def clear() -> None:
    """Forgets observations and generic variants (tests: a new process; the
    cache folder keeps its own)."""
    _observed.clear()
    _generic.clear()
    _families_read.clear()
    _given_up.clear()
    _baked.clear()
