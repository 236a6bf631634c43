"""Lazy-key kernels for ops the TorchScript LTC backend cannot trace.

The stock backend sends such ops to its eager fallback, which executes the
pending graph, runs the op on the CPU and uploads the result: one graph
execution per call (AdamW's ``lerp``: 53 per step). Worse, for ops returning
tensor lists (``split_copy``, ``unbind_copy``) the fallback hands back CPU
tensors. We register kernels on the ``Lazy`` dispatch key instead, tried in
this order for every functional op whose Lazy entry is the eager fallback:

1. hand-written kernels for ops users hit (split, unbind, lerp), below;
2. the op's ``torch._decomp`` decomposition, when it is written with aten
   ops (those written with ``torch._refs``/prims build ``as_strided`` views
   the lazy device cannot run, so they are skipped), run under
   functionalization: a Lazy kernel sits below it, where a view op
   (``unsqueeze``, ``permute``) would reach LTC as ``as_strided``, which it
   cannot trace; functionalized, views become the ``*_copy`` ops LTC traces;
3. the op itself as a TorchScript builtin node in the traced graph
   (``_C.trace_builtin``, output shapes from the op's meta kernel, or for
   ops with none from ``shape_functions``: ``_logcumsumexp``, ``geqrf``;
   kept per argument signature, as every step asks again): aten's own
   kernel then runs inside the graph;
4. the eager path, counted in ``lazy_mlir.metrics`` under the op's name and
   the user's source line (an error at O2, see ``syncs``).

Mutable variants (``where.self_out``, ``sin_``...) never reach the Lazy key
from user code: functionalization rewrites them. But composite kernels run
below functionalization, and some call them (``_safe_softmax``, reached by
every masked or causal ``scaled_dot_product_attention``, ends in
``where.self_out``): each such call was an eager fallback, a graph execution
of its own. Every mutable variant that LTC lacks and that has a functional
sibling (same name, same non-out arguments) therefore gets a kernel that
traces the sibling and copies the result into the mutated arguments.

A decomposition that raises or returns non-lazy tensors is not trusted again
and the op moves on to 3; one that returns ``NotImplemented`` (it does not
handle these arguments, e.g. ``adaptive_max_pool2d``'s) goes to 3 for that call.

Functional ops that do have a kernel, aten's CompositeExplicitAutograd one,
also run below functionalization, and some of those kernels use views
(``addr``, ``rot90``, ``any.dims``, ``unsafe_split``) or resize an empty out=
buffer (``logsumexp``), which the lazy device refuses. Each such op (tensor
inputs, no Lazy kernel of its own) gets a kernel that runs the composite
kernel as before; the first time it hits one of those refusals, the op is
traced from then on like its decomposition: the composite kernel re-run
under functionalization (views become ``*_copy`` ops), else 3, else 4.
Costs: ~7 us of Python per call of such an op; the first refused view per op
and process executes the pending graph (LTC's fallback moves the arguments to
the CPU before refusing), and is not counted as an eager fallback.
Kernels sit below autograd: derivatives stay aten's. The same holds for
functional ``torch.library.custom_op`` ops (any namespace; torch's own
``torch_nn::_linear_cross_entropy_batch_chunked*`` behind
``linear_cross_entropy(options=...)``): their Python body is their composite
kernel (``cover_custom_ops``, run by ``install``).

Mutable ops also match ``*_functional`` variants (``_native_batch_norm_legit``:
its results, then the new running stats) and factory out= variants their
factory (``eye.m_out`` -> ``eye.m`` on the out tensor's dtype); a composite
kernel that calls a mutable op with no such variant (``cummax`` ->
``_cummax_helper``), or that reads its inputs' data on the host
(``_grouped_mm``'s offsets), is traced as a node. Some of LTC's own Lazy
kernels are wrong or call the eager fallback: ``LTC_REPLACED`` replaces them
(``pixel_shuffle`` returned uninitialised memory; integer ``histc``, which
CPU lacks, counts in float64).

Why one module of ~1,000 lines: the four kinds of kernel above are one
ordered chain per op (``install`` tries them in turn, and a kernel that
refuses hands the op to the next): their tables and the order they are
tried in read together here.
"""
from __future__ import annotations

import re
import threading
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..cluster import compilable
from ..native import _C
from ..observe import metrics, syncs
from . import data_dependent, shape_functions

aten = torch.ops.aten
_LIB: torch.library.Library | None = None
_reentry = threading.local()
_untrusted: set[str] = set()  # ops whose decomposition failed on lazy tensors
_DECOMPOSED: set[str] = set()
_BUILTIN: set[str] = set()
_MUTABLE: set[str] = set()
_COMPOSITE: set[str] = set()       # composite kernels run through _composite_kernel
_COMPOSITE_REFUSED: set[str] = set()  # ... that hit a lazy-device refusal: traced another way now
_COMPOSITE_AS_NODE: set[str] = set()  # ... that called a mutable op with no functional sibling
_UNMATCHED: set[str] = set()       # mutable ops with no functional sibling (see _unmatched_mutable_kernel)
_REPLACED: set[str] = set()        # LTC's own kernels replaced (see LTC_REPLACED)
_CUSTOM_LIBS: dict[str, torch.library.Library] = {}  # namespace -> our Lazy kernels for its custom ops


# --------------------------------------------------------------- hand-written
def _split_copy(self, split_size, dim=0):
    dim = dim % self.dim()
    size = self.size(dim)
    starts = range(0, max(size, 1), split_size) if size else [0]
    return [aten.slice_copy.Tensor(self, dim, s, min(s + split_size, size)) for s in starts]


def _split_with_sizes_copy(self, split_sizes, dim=0):
    dim = dim % self.dim()
    out, start = [], 0
    for n in split_sizes:
        out.append(aten.slice_copy.Tensor(self, dim, start, start + n))
        start += n
    return out


def _unbind_copy(self, dim=0):
    dim = dim % self.dim()
    return [aten.select_copy.int(self, dim, i) for i in range(self.size(dim))]


def _lerp_scalar(self, end, weight):
    # self + weight * (end - self): the formula AdamW's exp_avg update expects
    return aten.add.Tensor(self, aten.sub.Tensor(end, self), alpha=weight)


def _lerp_tensor(self, end, weight):
    return aten.add.Tensor(self, aten.mul.Tensor(weight, aten.sub.Tensor(end, self)))


def _eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    # aten's kernel fills an empty buffer through eye.m_out: an eager fallback on lazy
    rows = aten.arange.start(0, n, dtype=torch.int64, device=device)
    cols = aten.arange.start(0, m, dtype=torch.int64, device=device)
    diagonal = aten.eq.Tensor(aten.view_copy.default(rows, [n, 1]), cols)
    return aten._to_copy.default(diagonal, dtype=torch.get_default_dtype() if dtype is None else dtype)


def _eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye_m(n, n, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)


def _amp_unscale(self, found_inf, inv_scale):
    # GradScaler's unscale and inf check: no TorchScript lowering (the eager
    # fallback executed the step's graph and copied every gradient: 19
    # graph executions a GPT-2 step), and a Tensor[] return the generic
    # builtin path does not take. One node (per-tensor ops traced here cost
    # ~0.5 ms a call on GPT-2), expanded into per-tensor ops when compiled
    # (lowering/grad_scaler.py), aten's kernel in TorchScript. The outputs'
    # shapes are the inputs': not the generic path's signature and meta
    # kernel (~40 us a call over GPT-2's gradients; GradScaler calls it every step).
    outputs = [(t.dtype, list(t.shape)) for t in self] + [(found_inf.dtype, list(found_inf.shape))]
    *grads, found = _C.trace_builtin("aten::_amp_foreach_non_finite_check_and_unscale", "default",
                                     [self, found_inf, inv_scale], outputs, [len(self), -1])
    return grads, found


def _histogramdd_bin_edges(*args, **kwargs):
    """histogramdd's edges, a tensor list (not traced by rule): one node,
    its sizes from shape_functions."""
    return trace_builtin(aten._histogramdd_bin_edges.default, args, kwargs)


HAND_WRITTEN = {
    "_amp_foreach_non_finite_check_and_unscale": _amp_unscale,
    "_histogramdd_bin_edges": _histogramdd_bin_edges,
    "_ctc_loss.Tensor": data_dependent.ctc_loss,
    "masked_select": data_dependent.masked_select,
    "repeat_interleave.Tensor": data_dependent.repeat_interleave,
    "bincount": data_dependent.bincount,
    "_unique2": data_dependent.unique,
    "eye": _eye,
    "eye.m": _eye_m,
    "split_copy.Tensor": _split_copy,
    "split_with_sizes_copy": _split_with_sizes_copy,
    "unbind_copy.int": _unbind_copy,
    "lerp.Scalar": _lerp_scalar,
    "lerp.Tensor": _lerp_tensor,
}


# ------------------------------------------------------------- registration
def _qualified(op: torch._ops.OpOverload) -> str:
    """'aten::add.Tensor' / 'aten::sin'"""
    return op._schema.name + (f".{op._overloadname}" if op._overloadname != "default" else "")


def _falls_back_on_lazy(qualified: str) -> bool:
    """True when the op's Lazy dispatch entry is the TS eager fallback."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return not any(has(qualified, key) for key in ("Lazy", "CompositeImplicitAutograd", "CompositeExplicitAutograd"))


def _resolve(qualified: str) -> torch._ops.OpOverload | None:
    """'aten::add.Tensor' -> torch.ops.aten.add.Tensor (None if Python cannot reach it)."""
    name, _, overload = qualified[len("aten::"):].partition(".")
    packet = getattr(aten, name, None)
    op = getattr(packet, overload or "default", None) if packet is not None else None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _is_functional_tensor_op(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False  # functionalization never sends in-place, out= or view ops here
    return bool(schema.returns) and all(isinstance(r.type, torch.TensorType) for r in schema.returns)


def _draws(op: torch._ops.OpOverload) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags


def _aten_written(decomposition) -> bool:
    module = getattr(decomposition, "__module__", "") or ""
    return not module.startswith(("torch._refs", "torch._prims"))


def _aten_ops_falling_back():
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith("aten::") and _falls_back_on_lazy(qualified):
            op = _resolve(qualified)
            if op is not None:
                yield op


# ------------------------------------------------------- mutable variants
def _argument_key(argument) -> tuple:
    return argument.name, str(argument.type)


_TENSOR_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _written(schema) -> list[int]:
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _sibling_targets(op: torch._ops.OpOverload, candidate: torch._ops.OpOverload,
                     composite_ok: bool = False) -> list | None:
    """Where each result of functional ``candidate`` goes for mutable ``op``:
    the index of the argument it is copied into, or None (a fresh result
    ``op`` returns). None when ``candidate`` does not compute what ``op`` writes.

    Same name (``where.self``, ``sin``): one result per mutated argument.
    ``*_functional`` (``_native_batch_norm_legit_functional``): ``op``'s
    results, then one per argument ``op`` updates in place (running stats).
    ``composite_ok``: also a factory whose Lazy entry is a composite kernel
    (see ``_host_factory``)."""
    schema, cs = op._schema, candidate._schema
    if cs.is_mutable or not all(isinstance(r.type, torch.TensorType) for r in cs.returns):
        return None
    written = _written(schema)
    inputs = [_argument_key(a) for a in schema.arguments if not a.is_out]
    keys = [_argument_key(a) for a in cs.arguments]
    if keys != inputs:
        # a factory's out= variant (eye.m_out -> eye.m): the sibling's
        # TensorOptions come from the out tensor
        extra = [a for a in cs.arguments[len(inputs):] if a.kwarg_only and a.name in _TENSOR_OPTIONS]
        if keys[:len(inputs)] != inputs or len(extra) != len(keys) - len(inputs) or not extra:
            return None
        if not (len(written) == 1 and schema.arguments[written[0]].is_out):
            return None
        if not (composite_ok or _has_own_lazy_kernel(_qualified(candidate))):
            return None  # its composite kernel would call op back with an empty({0}) out (linspace)
    if not cs.name.endswith("_functional"):
        return written if len(cs.returns) == len(written) else None
    by_alias = {frozenset(schema.arguments[i].alias_info.before_set): i for i in written}
    targets = [by_alias.get(frozenset(r.alias_info.before_set)) if r.alias_info is not None else None
               for r in schema.returns]
    targets += [i for i in written if i not in targets]
    return targets if len(cs.returns) == len(targets) else None


def _functional_sibling(op: torch._ops.OpOverload, composite_ok: bool = False) -> torch._ops.OpOverload | None:
    """The overload that computes what mutable ``op`` writes: ``where.self``
    for ``where.self_out``, ``sin`` for ``sin_``, ``eye.m`` for ``eye.m_out``,
    ``_native_batch_norm_legit_functional`` for ``_native_batch_norm_legit``
    (see ``_sibling_targets``, and it for ``composite_ok``)."""
    base = op._schema.name[len("aten::"):]
    if base.startswith("__i") and base.endswith("__"):  # Python's in-place operators: __ilshift__ -> __lshift__
        names = ["__" + base[3:]]
    else:
        names = [base[:-1]] if base.endswith("_") and not base.endswith("__") else [base]
    names.append(names[0] + "_functional")
    for name in names:
        packet = getattr(aten, name, None)
        for overload in (packet.overloads() if packet is not None else ()):
            candidate = getattr(packet, overload)
            if _sibling_targets(op, candidate, composite_ok) is not None:
                return candidate
    return None


def _host_factory(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The factory of numbers only whose out= variant is ``op``, when its
    Lazy entry is aten's composite kernel, which calls ``op`` back with an
    empty({0}) out the lazy device cannot resize: ``linspace`` for
    ``linspace.out`` (also logspace, range)."""
    schema = op._schema
    if any(isinstance(a.type, torch.TensorType) and not a.is_out for a in schema.arguments):
        return None
    packet = getattr(aten, schema.name[len("aten::"):], None)
    for overload in (packet.overloads() if packet is not None else ()):
        candidate = getattr(packet, overload)
        named = _qualified(candidate)
        if (_sibling_targets(op, candidate, composite_ok=True) is not None and not _has_own_lazy_kernel(named)
                and torch._C._dispatch_has_kernel_for_dispatch_key(named, "CompositeExplicitAutograd")):
            return candidate
    return None


def _host_factory_kernel(op):
    """``op`` (a factory of numbers: linspace) made on the host and handed to
    the step as device data, as a tensor the user moves there: no sync, no
    eager fallback (nothing lazy is read)."""

    def kernel(*args, **kwargs):
        device = kwargs.get("device") or torch.device("lazy")
        return op(*args, **{**kwargs, "device": torch.device("cpu")}).to(device)

    return kernel


def _active_ops() -> set:
    """Ops whose Lazy kernel is running on this thread (to break cycles)."""
    active = getattr(_reentry, "ops", None)
    if active is None:
        active = _reentry.ops = set()
    return active


def _mutable_kernel(op, functional):
    name = _qualified(op)
    schema = op._schema
    targets = _sibling_targets(op, functional)
    inputs = [i for i, a in enumerate(schema.arguments) if not a.is_out]
    formal = functional._schema.arguments
    options = [a.name for a in formal[len(inputs):]]  # TensorOptions taken from the out tensor
    keywords = [a.name for a in formal[:len(inputs)] if a.kwarg_only]
    functional_name = functional._schema.name.endswith("_functional")

    def kernel(*args, **kwargs):
        full = _schema_arguments(op, args, kwargs)
        values = [full[i] for i in inputs]
        extra = {}
        if options:
            out = full[targets[0]]
            extra = {k: v for k, v in dict(dtype=out.dtype, layout=out.layout, device=out.device).items()
                     if k in options}
        active = _active_ops()
        if name in active:
            # The sibling's own composite kernel calls this op back
            # (logical_not -> logical_not.out): trace the sibling as a node.
            results = trace_builtin(functional, values, extra)
        else:
            active.add(name)
            try:
                positional = values[:len(values) - len(keywords)]
                results = functional(*positional, **dict(zip(keywords, values[len(positional):])), **extra)
            finally:
                active.discard(name)
        results = [results] if isinstance(results, torch.Tensor) else list(results)
        pairs = [(full[i], r) for i, r in zip(targets, results) if i is not None]
        if any(t.shape != r.shape for t, r in pairs):
            # LTC's resize_ lowers to a malformed aten::resize
            raise NotImplementedError(f"lazy_mlir: {_qualified(op)} with an out= tensor of another size: "
                                      "the lazy device cannot resize it")
        for target, result in pairs:
            if target.device == result.device:  # LTC's copy_ refuses a target an eager fallback synced
                _C.write_lazy(target, result)
            else:
                target.copy_(result)
        if functional_name:  # op's own results: fresh ones, or the arguments they alias
            fresh = iter(r for i, r in zip(targets, results) if i is None)
            written = {frozenset(schema.arguments[i].alias_info.before_set): full[i] for i in _written(schema)}
            returned = [written[frozenset(r.alias_info.before_set)] if r.alias_info is not None else next(fresh)
                        for r in schema.returns]
            return returned[0] if len(returned) == 1 else tuple(returned)
        written = [t for t, _ in pairs]
        return written[0] if len(written) == 1 else tuple(written)

    return kernel


_NO_SIBLING = "has no functional sibling: the composite op calling it is traced as a node"


def _unmatched_mutable_kernel(op):
    """A mutable op with no functional sibling (``_cummax_helper``). Called
    from a composite kernel, it refuses (``_composite_kernel`` then traces the
    composite op itself, e.g. ``cummax``, as a node); else LTC's eager
    fallback runs it, as before."""
    name = _qualified(op)
    fallback = torch.library.get_kernel(op, "Lazy")  # LTC's eager fallback
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Lazy)

    def kernel(*args, **kwargs):
        if getattr(_reentry, "composite", 0) or _C.inside_direct_composite():
            raise NotImplementedError(f"lazy_mlir: {name} {_NO_SIBLING}")
        return fallback.call_boxed(keys, *args, **kwargs)

    return kernel


def mutable_ops() -> list[str]:
    """Mutable variants traced through their functional sibling."""
    return sorted(_MUTABLE)


# Why an op takes the eager path, by what it is (uncovered_ops); the first that holds.
_OTHER_DEVICES = re.compile(r"cudnn|miopen|mps|flash_attention|efficient_attention|_triton|cslt|_fused_sdp_choice")
_OTHER_LAYOUTS = re.compile(r"^aten::(_indices|_values|_nnz|_dim[IV]|q_|qscheme|quantize|dequantize|_nested|_sparse|"
                            r"_validate_compressed|_?to_sparse|sparse_|hspmm|_spsolve|_spdiags|_coalesce|_?to_dense|"
                            r"_?mkldnn|to_mkldnn|int_repr|_make_per|_?empty_\w*quantized|_?fake_quantize|"
                            r"to_padded_tensor|_padded_dense_to_jagged)")
_WHY = (
    (lambda q, op: op is None, "Python cannot name it"),
    (lambda q, op: _OTHER_DEVICES.search(q),
     "another backend's own kernel (CUDA, MPS, the CPU's flash attention): the lazy device takes the op's traced path"),
    (lambda q, op: _OTHER_LAYOUTS.search(q), "sparse, quantized, nested or MKLDNN tensors, which the lazy device has not"),
    (lambda q, op: torch.Tag.nondeterministic_seeded in op.tags,
     "random, with no traced sampling sibling (CUDA's dropout kernels): drawn eagerly, at once"),
    (lambda q, op: not op._schema.is_mutable and any(r.alias_info is not None for r in op._schema.returns),
     "a view: functionalization hands the lazy device its *_copy op instead"),
    (lambda q, op: op._schema.is_mutable, "mutates its arguments, with no functional sibling to trace"),
    (lambda q, op: not any(isinstance(r.type, (torch.TensorType, torch.ListType)) for r in op._schema.returns),
     "returns a host value (the eager path reads its inputs)"),
    (lambda q, op: torch.Tag.dynamic_output_shape in op.tags,
     "its sizes come from its inputs' values, with no rule to read them (trace/data_dependent.py)"),
    (lambda q, op: any(isinstance(r.type, torch.ListType) for r in op._schema.returns),
     "returns a tensor list (traced only where hand-written: split, unbind)"),
    (lambda q, op: _without_shapes(q), "no Meta kernel, and no kernel of the backing device's to run on zeros "
                                       "(another device's own) or no tensor argument: each call runs eagerly"),
)


def _why_uncovered(qualified: str) -> str:
    op = _resolve(qualified)
    return next((why for holds, why in _WHY if holds(qualified, op)), "other")


def _without_shapes(qualified: str) -> bool:
    """A traced op (a builtin node) whose output sizes nothing computes
    (shape_functions.computable): each call takes the eager path."""
    return (qualified in _BUILTIN and qualified not in data_dependent.TRACED
            and not shape_functions.computable(qualified, _resolve(qualified)))


def _data_dependent_falling_back(qualified: str) -> bool:
    """A traced op (a builtin node) whose sizes come from data: its meta
    kernel refuses, and the call takes the eager path (``unique``)."""
    op = _resolve(qualified)
    return (op is not None and torch.Tag.dynamic_output_shape in op.tags and qualified in _BUILTIN
            and qualified not in data_dependent.TRACED)


def uncovered_ops() -> dict[str, str]:
    """aten ops that still take the eager path on the lazy device, each with
    the reason (random ops, other devices' kernels, sizes from data...).
    The kernels are lazy_mlir's once ``lazy_mlir.init()`` installed them:
    before, every op without one of the stock backend's would be listed."""
    if _LIB is None:
        raise RuntimeError("lazy_kernels.uncovered_ops(): call lazy_mlir.init() first; before it installs its "
                           "kernels, the list would be the stock lazy backend's (~1,300 ops)")
    return {q: _why_uncovered(q) for q in sorted(torch._C._dispatch_get_all_op_names())
            if q.startswith("aten::") and (_falls_back_on_lazy(q) or q in _UNMATCHED
                                           or _data_dependent_falling_back(q) or _without_shapes(q)
                                           # traced as nodes, but no lazy tensor has their layouts
                                           or (q in _BUILTIN and _OTHER_LAYOUTS.search(q)))}


# ---------------------------------------------------------- builtin tracing
def _schema_arguments(op, args, kwargs) -> list:
    """All schema arguments in order, defaults filled in."""
    full = []
    for i, formal in enumerate(op._schema.arguments):
        if i < len(args):
            full.append(args[i])
        elif formal.name in kwargs:
            full.append(kwargs[formal.name])
        elif formal.has_default_value():
            full.append(formal.default_value)
        else:
            raise TypeError(f"{op}: missing argument {formal.name}")
    return full


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device) and x.type == "lazy":  # a factory's device argument
        return torch.device("meta")
    return x


class _Unknown(Exception):
    """An argument whose effect on output shapes cannot be told from its value."""


_PLAIN = (bool, int, str, type(None), torch.dtype, torch.memory_format, torch.layout, torch.device)


def _signature(x):
    """What an op's output dtypes and shapes can depend on in argument ``x``,
    hashable: a tensor's dtype and sizes, a scalar's type and value (a float
    by its bits: -0.0 is not 0.0)."""
    if isinstance(x, torch.Tensor):
        return torch.Tensor, x.dtype, tuple(x.shape)
    if isinstance(x, _PLAIN):
        return type(x), x
    if isinstance(x, float):
        return float, x.hex()
    if isinstance(x, (list, tuple)):
        return type(x), tuple(_signature(item) for item in x)
    raise _Unknown  # SymInt, Generator, ...


# (op, argument signatures) -> the output shapes of trace_builtin: steps
# trace the same ops on the same shapes, and the meta kernels of many ops
# (torch._refs, Python) cost more than tracing the node (~0.1-1 ms each:
# T5's attention spent a third of its trace in them).
_OUTPUT_SHAPES: dict = {}
_OUTPUT_SHAPES_MAX = 50_000


def _output_shapes(op, args, kwargs) -> tuple[list, list]:
    """([(dtype, sizes)] of the node's outputs, Tensor[] return lengths)."""
    try:
        key = op, _signature(args), _signature(tuple(sorted(kwargs.items())))
    except _Unknown:
        key = None
    known = _OUTPUT_SHAPES.get(key) if key is not None else None
    if known is not None:
        return known
    shapes = shape_functions.shapes_of(_qualified(op), op)
    meta_out = shapes(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    single = len(op._schema.returns) == 1
    returns = [meta_out] if single else list(meta_out)
    lists = [isinstance(r.type, torch.ListType) for r in op._schema.returns]
    list_sizes = [len(r) if is_list else -1 for r, is_list in zip(returns, lists)] if any(lists) else []
    outputs = [(t.dtype, list(t.shape)) for r, is_list in zip(returns, lists) for t in (r if is_list else [r])]
    if key is not None:
        if len(_OUTPUT_SHAPES) >= _OUTPUT_SHAPES_MAX:
            _OUTPUT_SHAPES.clear()
        _OUTPUT_SHAPES[key] = outputs, list_sizes
    return outputs, list_sizes


def trace_builtin(op, args, kwargs):
    """Traces ``op`` as one TorchScript builtin node; raises if it cannot.
    Tensor[] returns come back as lists: the node's outputs are their
    items, unpacked by its lowering."""
    outputs, list_sizes = _output_shapes(op, args, kwargs)
    single = len(op._schema.returns) == 1
    results = _C.trace_builtin(op._schema.name, op._overloadname, _schema_arguments(op, args, kwargs),
                               outputs, list_sizes)
    items, out = iter(results), []
    for n in (list_sizes or [-1] * len(op._schema.returns)):
        out.append(next(items) if n < 0 else [next(items) for _ in range(n)])
    return out[0] if single else tuple(out)


def _builtin_kernel(op):
    position = _indices_position(op)
    # a gather by a boolean mask has data-dependent sizes: it gathers at the
    # mask's nonzero positions instead (index_put's sizes are its input's)
    reads_masks = _qualified(op) in ("aten::index.Tensor", "aten::_unsafe_index.Tensor")

    def kernel(*args, **kwargs):
        try:
            if position is not None and position < len(args):  # the dispatcher passes it positionally
                args = _host_indices_moved(position, args)
                if reads_masks:
                    indices = data_dependent.boolean_indices_as_integers(args[position], "a boolean index")
                    args = args[:position] + (indices,) + args[position + 1:]
            return trace_builtin(op, args, kwargs)
        except Exception:  # noqa: BLE001 - e.g. data-dependent output shapes
            return eager_fallback(op, args, kwargs)

    return kernel


def _sampling_kernel(op):
    """A sampling op as a node; given a generator of its own, the eager path:
    the draws are that generator's, at once, as eagerly (a node would hold the
    generator as a constant, and a cached graph another call's)."""
    traced = _builtin_kernel(op)

    def kernel(*args, **kwargs):
        if any(isinstance(a, torch.Generator) for a in (*args, *kwargs.values())):
            return eager_fallback(op, args, kwargs)
        return traced(*args, **kwargs)

    return kernel


def _indices_position(op) -> int | None:
    """Where an indexing op (index, index_put...) takes its ``Tensor?[] indices``."""
    for i, formal in enumerate(op._schema.arguments):
        if formal.name == "indices" and str(formal.type) == "List[Optional[Tensor]]":
            return i
    return None


def _host_indices_moved(position: int, args: tuple) -> tuple:
    """Index tensors on the host moved to the lazy device, as aten moves them
    to the indexed tensor's device (BEiT indexes its relative position table
    with a host tensor): traced, not run eagerly."""
    indices = args[position]
    if not indices or all(t is None or t.device.type == "lazy" for t in indices):
        return args
    moved = [t if t is None or t.device.type == "lazy" else t.to(args[0].device) for t in indices]
    return args[:position] + (moved,) + args[position + 1:]


# ------------------------------------------------------------ decompositions
def _is_lazy(x) -> bool:
    return not isinstance(x, torch.Tensor) or x.device.type == "lazy"


def eager_fallback(op, args, kwargs):
    """Run ``op`` on the CPU and move its results back: what LTC's own fallback
    does (it executes the pending graph), but counted under the op's name and
    the user's source line; at O2 an error (see ``syncs.eager_fallback``)."""
    syncs.eager_fallback(_qualified(op))
    lazy_inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.device.type == "lazy"]
    device = lazy_inputs[0].device if lazy_inputs else torch.device("lazy")
    # Inputs that depend on random draws: sync the whole step first, or what
    # else depends on the draws (masks saved for backward) draws again later.
    _C.sync_live_tensors_before_read(lazy_inputs)

    def to_cpu(x):  # a factory's lazy device argument too: else it calls this kernel back
        if isinstance(x, torch.Tensor):
            return x.cpu()
        return torch.device("cpu") if isinstance(x, torch.device) and x.type == "lazy" else x

    out = op(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, out)


def _decomposed_kernel(op, decomposition):
    name = str(op)

    def kernel(*args, **kwargs):
        active = _active_ops()
        if name in _untrusted or name in active:
            return _builtin_kernel(op)(*args, **kwargs)
        out = None
        active.add(name)
        try:
            out = _functionalized(decomposition, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure means: don't trust it
            reason = f"{type(exc).__name__}: {exc}"
            if _refusal(exc):  # LTC counted the refused view op as a fallback; the op is traced below
                metrics.count_refused_fallback(_refusal(exc))
        else:
            reason = None if all(_is_lazy(x) for x in tree_flatten(out)[0]) else "returned non-lazy tensors"
        finally:
            active.discard(name)
        if out is NotImplemented:  # the decomposition does not handle these arguments
            return _builtin_kernel(op)(*args, **kwargs)
        if reason is None:
            return out
        _untrusted.add(name)
        warnings.warn(f"lazy_mlir: decomposition of {name} failed on the lazy device ({reason}); "
                      "tracing the op itself from now on", RuntimeWarning, stacklevel=2)
        return _builtin_kernel(op)(*args, **kwargs)

    return kernel


def _functionalized(fn, args, kwargs):
    """``fn(*args, **kwargs)`` with functionalization re-entered. Below the
    Functionalize key (where Lazy kernels run) it is excluded in TLS: lift
    that exclusion, wrap the inputs, then sync and unwrap the outputs."""
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.Functionalize)
    include = torch._C._dispatch_tls_local_include_set()

    def wrap(x):
        return torch._to_functional_tensor(x) if isinstance(x, torch.Tensor) else x

    def unwrap(x):
        if isinstance(x, torch.Tensor) and torch._is_functional_tensor(x):
            torch._sync(x)
            return torch._from_functional_tensor(x)
        return x

    # Nested (a decomposition calls an op we decompose too: max_pool3d's
    # calls floor_divide): functionalization is on already, and enabling it
    # twice is an error ("multiple layers of mode-style functionalization").
    nested = torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Functionalize)
    with torch._C._ForceDispatchKeyGuard(include, exclude):
        if not nested:
            torch._enable_functionalization(reapply_views=False)
        try:
            return tree_map(unwrap, fn(*tree_map(wrap, args), **tree_map(wrap, kwargs)))
        finally:
            if not nested:
                torch._disable_functionalization()


# ------------------------------------------------------ composite kernels
# What the lazy device refuses inside a composite kernel (it runs below
# functionalization): a view op (LTC's eager fallback refuses views), or an
# out= buffer of another size (see _mutable_kernel).
_REFUSED_VIEW = re.compile(r"The operator (\S+) appears to be a view operator, but it has no implementation "
                           r"for the backend \"lazy")
_REFUSED_RESIZE = "the lazy device cannot resize it"
# A composite kernel that reads its inputs' data on the host (_grouped_mm's
# CPU kernel loops over its group offsets): traced as a node, whose aten
# kernel then runs on real tensors.
_READS_DATA = "Cannot access data pointer of Tensor that doesn't have storage"


def _refusal(exc: Exception) -> str | None:
    """The view op the lazy device refused ('aten::view'), '' for a resize, else None."""
    match = _REFUSED_VIEW.search(str(exc))
    if match:
        return match.group(1)
    return "" if any(why in str(exc) for why in (_REFUSED_RESIZE, _NO_SIBLING, _READS_DATA)) else None


def _composite_kernel(op):
    name = _qualified(op)
    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    tensor_out = all(isinstance(r.type, torch.TensorType) for r in op._schema.returns)

    def run_composite(*args, **kwargs):
        return op.redispatch(composite, *args, **kwargs)

    def kernel(*args, **kwargs):
        if name in _COMPOSITE_AS_NODE:
            return _builtin_kernel(op)(*args, **kwargs)
        if name not in _COMPOSITE_REFUSED:
            _reentry.composite = getattr(_reentry, "composite", 0) + 1
            try:
                out = run_composite(*args, **kwargs)
                _C.set_composite_direct(name, True)  # its C++ front (kernel_fronts.h) calls the kernel itself now
                return out
            except (RuntimeError, NotImplementedError) as exc:
                refused = _refusal(exc)
                if refused is None:
                    raise  # the user's error (shapes, dtypes): eager gives it too
                _C.set_composite_direct(name, False)
                if (_NO_SIBLING in str(exc) or _READS_DATA in str(exc)) and tensor_out:
                    _COMPOSITE_AS_NODE.add(name)
                    return _builtin_kernel(op)(*args, **kwargs)
                if refused:
                    metrics.count_refused_fallback(refused)
                _COMPOSITE_REFUSED.add(name)
            finally:
                _reentry.composite -= 1
        active = _active_ops()
        if name not in active:
            active.add(name)
            try:
                out = _functionalized(run_composite, args, kwargs)
                if all(_is_lazy(x) for x in tree_flatten(out)[0]):
                    return out
            except (RuntimeError, NotImplementedError) as exc:
                refused = _refusal(exc)
                if refused is None:
                    raise
                if refused:
                    metrics.count_refused_fallback(refused)
            finally:
                active.discard(name)
        if tensor_out:
            return _builtin_kernel(op)(*args, **kwargs)
        return eager_fallback(op, args, kwargs)

    return kernel


def _runs_composite_on_lazy(qualified: str) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return (has(qualified, "CompositeExplicitAutograd") and not has(qualified, "CompositeImplicitAutograd")
            and not _has_own_lazy_kernel(qualified))


def _has_own_lazy_kernel(qualified: str) -> bool:
    """A Lazy kernel registered for the op itself (LTC's or ours), not a
    composite kernel the dispatcher fills in for it."""
    lazy = [line for line in torch._C._dispatch_dump_table(qualified).splitlines() if line.startswith("Lazy:")]
    return bool(lazy) and "[kernel]" in lazy[0]


def _composite_candidate(op: torch._ops.OpOverload) -> bool:
    """A functional op with tensor inputs whose Lazy entry is its composite kernel."""
    schema = op._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False
    if torch.Tag.nondeterministic_seeded in op.tags or not schema.returns:
        return False
    tensor = lambda t: isinstance(t, torch.TensorType) or (  # noqa: E731
        isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.TensorType))
    if not all(tensor(r.type) for r in schema.returns):
        return False
    return any(tensor(a.type) for a in schema.arguments)  # factories: no lazy tensor to view


def composite_ops() -> list[str]:
    """Ops whose composite kernel hit a lazy-device refusal and are traced another way."""
    return sorted(_COMPOSITE_REFUSED | _COMPOSITE_AS_NODE)


def decomposed_ops() -> list[str]:
    """Ops traced through a torch._decomp decomposition."""
    return sorted(_DECOMPOSED)


def builtin_ops() -> list[str]:
    """Ops traced as TorchScript builtin nodes."""
    return sorted(_BUILTIN)


def _inplace_pointwise_with_python_meta():
    """In-place pointwise ops (``mul_``, ``addcdiv_``, ``lerp_``...) whose Meta
    kernel is a Python ref: functionalization calls it on every in-place op
    of a lazy tensor (see lazy_backend/kernels/meta_kernels.h)."""
    import torch._meta_registrations  # noqa: F401 - registers the Python kernels we replace

    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        if not name.endswith("_") or name.startswith("_"):
            continue
        op = getattr(getattr(aten, name, None), overload or "default", None)
        if not isinstance(op, torch._ops.OpOverload) or torch.Tag.pointwise not in op.tags:
            continue
        schema = op._schema
        first = schema.arguments[0] if schema.arguments else None
        if first is None or first.alias_info is None or not first.alias_info.is_write or len(schema.returns) != 1:
            continue
        if any(isinstance(a.type, torch.ListType) for a in schema.arguments):
            continue
        meta = [line for line in torch._C._dispatch_dump_table(qualified).splitlines() if line.startswith("Meta:")]
        if meta and ".py:" in meta[0]:
            yield qualified[len("aten::"):]


def install() -> None:
    """Register all Lazy-key kernels. Idempotent; custom ops defined since the
    last call are covered (see ``cover_custom_ops``)."""
    global _LIB
    if _LIB is not None:
        cover_custom_ops()
        return
    _LIB = torch.library.Library("aten", "IMPL")
    _C.register_fill_kernels()  # before the composite ops are looked for below: these are not among them
    _C.register_safe_softmax_kernel()  # likewise
    _C.register_strided_kernels()  # likewise
    _C.register_value_read_kernels()  # item() of a value that depends on random draws
    _C.register_meta_kernels(list(_inplace_pointwise_with_python_meta()))
    for name, fn in HAND_WRITTEN.items():
        _LIB.impl(name, fn, "Lazy")
    functional, mutable, mutable_draws = [], [], []
    for op in _aten_ops_falling_back():
        if _is_functional_tensor_op(op):
            functional.append(op)
        elif op._schema.is_mutable:
            (mutable_draws if _draws(op) else mutable).append(op)
    for op in functional:
        if _draws(op):
            # A sampling op traced as a node draws when the step runs, in
            # trace order with the other draws (the glue keeps it:
            # compilable.RANDOM_OPS), from the default generator, as eager
            # does; run eagerly it drew at once, ahead of the traced draws
            # before it. An explicit generator takes the eager path; other
            # random ops (other devices' fused kernels) stay eager.
            if op._schema.name in compilable.RANDOM_OPS:
                _LIB.impl(_qualified(op)[len("aten::"):], _sampling_kernel(op), "Lazy")
                _BUILTIN.add(_qualified(op))
        elif _qualified(op)[len("aten::"):] not in HAND_WRITTEN:
            _register_functional(op)
    draw_siblings = _draw_siblings(mutable_draws)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in mutable:  # after the functional kernels: the siblings they call
        factory = _host_factory(op)
        if factory is not None:  # its own kernel: never its composite calling op, and op's sibling
            _LIB.impl(_qualified(factory)[len("aten::"):], _host_factory_kernel(factory), "Lazy")
        sibling = _functional_sibling(op)
        sibling_name = _qualified(sibling) if sibling is not None else None
        if sibling is None:
            # Reached from a composite kernel (cummax -> _cummax_helper), the
            # composite op is traced as a node instead; else LTC's eager fallback.
            _LIB.impl(_qualified(op)[len("aten::"):], _unmatched_mutable_kernel(op), "Lazy")
            _UNMATCHED.add(_qualified(op))
            continue
        _LIB.impl(_qualified(op)[len("aten::"):], _mutable_kernel(op, sibling), "Lazy")
        _MUTABLE.add(_qualified(op))
        if not has(sibling_name, "Lazy") and has(sibling_name, "CompositeExplicitAutograd"):
            # Its composite kernel calls this out= variant with an empty({0})
            # buffer (logical_not, frexp, kthvalue...), which the lazy device
            # cannot resize: trace the sibling itself.
            _register_functional(sibling)
    with warnings.catch_warnings():  # "Overriding a previously registered kernel"
        warnings.simplefilter("ignore")
        for name, register in LTC_REPLACED.items():
            register(_resolve("aten::" + name))
    for qualified in torch._C._dispatch_get_all_op_names():  # after all the above: ops still composite
        if qualified.startswith("aten::") and _runs_composite_on_lazy(qualified):
            op = _resolve(qualified)
            if op is not None and _composite_candidate(op):
                _LIB.impl(qualified[len("aten::"):], _composite_kernel(op), "Lazy")
                _COMPOSITE.add(qualified)
    # C++ fronts over the kernels a per-op trace calls every step (~16 us a
    # builtin call and ~4 a composite call of Python, kernel_fronts.h)
    _C.front_builtin_kernels(sorted(_BUILTIN))
    _C.front_composite_kernels(sorted(_COMPOSITE))
    # Every random op's Lazy kernel so far now records its draws: unused
    # draws run too, as in eager, and a recompute replays them (dead_draws.h).
    # The in-place draws registered after it call one of those kernels, so
    # each draw is recorded once.
    _C.install_dead_draws()
    for op, sibling in draw_siblings:  # each traces its sibling, written into its target
        _LIB.impl(_qualified(op)[len("aten::"):], _mutable_kernel(op, sibling), "Lazy")
        _MUTABLE.add(_qualified(op))
    cover_custom_ops()


def _draw_siblings(mutable_draws: list) -> list[tuple]:
    """(in-place or out= draw, its functional sampling sibling) for each draw
    that takes LTC's eager fallback (``exponential_``, ``bernoulli_.Tensor``,
    ``randperm.generator_out``, RReLU's noise), where the sibling is a traced
    draw. A sibling whose Lazy entry is aten's composite kernel calls that
    draw on a clone (a factory: on an out= tensor), which ran eagerly: drawn
    at once, ahead of the traced draws before it. It is traced as a node
    instead (a factory's node takes its device argument's device,
    builtin_op_node.h)."""
    pairs = []
    for op in mutable_draws:
        sibling = _functional_sibling(op, composite_ok=True)
        if sibling is None or sibling._schema.name not in compilable.RANDOM_OPS:
            continue
        qualified = _qualified(sibling)
        if _runs_composite_on_lazy(qualified) and qualified not in _BUILTIN:
            _LIB.impl(qualified[len("aten::"):], _sampling_kernel(sibling), "Lazy")
            _BUILTIN.add(qualified)
        pairs.append((op, sibling))
    return pairs


def _custom_op_defs() -> list:
    """The ``torch.library.custom_op`` operators defined so far (torch's own
    included: ``linear_cross_entropy``'s chunked ops, defined on first use)."""
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401 - defines torch_nn::_linear_cross_entropy_*
    except ImportError:
        pass
    from torch._library import custom_ops
    return list(getattr(custom_ops, "OPDEFS", {}).values())


def cover_custom_ops() -> list[str]:
    """A functional ``torch.library.custom_op`` op has one kernel for every
    backend, its Python body (CompositeExplicitAutograd); on the lazy device
    it runs below functionalization, where the views it calls are refused.
    Each such op without a Lazy kernel of its own gets the composite-kernel
    treatment of aten's (``_composite_kernel``): on the first refusal its body
    is re-run under functionalization, else traced as a node, else run
    eagerly. Called by ``install`` (hence ``lazy_mlir.init``); a custom op
    defined later is covered by calling it again. Returns the ops covered now."""
    covered = []
    for opdef in _custom_op_defs():
        op = getattr(opdef, "_opoverload", None)
        if not isinstance(op, torch._ops.OpOverload):
            continue
        qualified = _qualified(op)
        if qualified in _COMPOSITE or not _runs_composite_on_lazy(qualified) or not _composite_candidate(op):
            continue
        namespace, _, name = qualified.partition("::")
        if namespace not in _CUSTOM_LIBS:
            _CUSTOM_LIBS[namespace] = torch.library.Library(namespace, "IMPL")
        _CUSTOM_LIBS[namespace].impl(name, _composite_kernel(op), "Lazy")
        _COMPOSITE.add(qualified)
        covered.append(qualified)
    return covered


# ------------------------------------------------ LTC's own kernels, replaced
def _register_composite_functionalized(op) -> None:
    """LTC's ``pixel_shuffle``/``pixel_unshuffle`` kernels
    (``functionalize_aten_op``) reach the op's Meta kernel with the lazy
    tensors; ``pixel_shuffle``'s (``meta_pixel_shuffle``) only allocates the
    output, which comes back uninitialised. Run aten's composite kernel
    (reshape, permute, clone) under functionalization, as LTC meant to."""
    qualified = _qualified(op)
    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional)

    def run_composite(*args, **kwargs):
        return op.redispatch(composite, *args, **kwargs)

    def kernel(*args, **kwargs):
        out = _functionalized(run_composite, args, kwargs)
        if all(_is_lazy(x) for x in tree_flatten(out)[0]):
            return out
        return _builtin_kernel(op)(*args, **kwargs)

    _LIB.impl(qualified[len("aten::"):], kernel, "Lazy")
    _REPLACED.add(qualified)


def _register_traced(op) -> None:
    """LTC's kernel calls its eager fallback (``max_pool3d_with_indices`` and
    its backward): trace the op like one LTC lacks."""
    _register_functional(op)
    _REPLACED.add(_qualified(op))


def _lazy_line(op) -> str:
    return next((line for line in torch._C._dispatch_dump_table(_qualified(op)).splitlines()
                 if line.startswith("Lazy:")), "")


def _register_math_autograd(op) -> None:
    """LTC's autograd kernel for ``max_pool3d`` (``MaxPool3dAutogradFunctionTS``)
    calls the eager fallback of ``max_pool3d_with_indices`` and its backward
    directly: use aten's CompositeImplicitAutograd kernel, as other backends do
    (``max_pool3d_with_indices``, traced, with aten's derivative)."""
    if "math kernel" not in _lazy_line(op):
        return
    math = torch.library.get_kernel(op, "Lazy")  # the math kernel fills the backend keys
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Lazy)

    def kernel(*args, **kwargs):
        return math.call_boxed(keys, *args, **kwargs)

    _LIB.impl(_qualified(op)[len("aten::"):], kernel, "AutogradLazy")
    _REPLACED.add(_qualified(op))


def _register_index_select(op) -> None:
    """LTC's shape function refuses a 0-d input ("Empty output_sizes is not
    supported"): a 0-d input is indexed as a 1-element one."""
    ltc = torch.library.get_kernel(op, "Lazy")
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Lazy)

    def kernel(self, dim, index):
        if self.dim() != 0:
            return ltc.call_boxed(keys, self, dim, index)
        picked = ltc.call_boxed(keys, aten.view_copy.default(self, [1]), 0, aten.view_copy.default(index, [-1]))
        return aten.view_copy.default(picked, [])

    _LIB.impl("index_select", kernel, "Lazy")
    _REPLACED.add(_qualified(op))


def _register_histc_of_integers(op) -> None:
    """CPU has no integer histogram, CUDA has: code that picks integer
    input off the CPU (transformers' MoE routing counts tokens per expert
    with ``histc(ids.int())`` unless the device is "cpu") failed when the
    graph ran. On a CPU-backed lazy device, integers count as float64
    (exact below 2**53) and the counts come back in their dtype."""
    ltc = torch.library.get_kernel(op, "Lazy")
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Lazy)

    def kernel(self, bins=100, min=0, max=0):
        if self.is_floating_point() or torch._C._lazy._get_default_device_type().lower() != "cpu":
            return ltc.call_boxed(keys, self, bins, min, max)
        counts = ltc.call_boxed(keys, aten._to_copy.default(self, dtype=torch.float64), bins, min, max)
        return aten._to_copy.default(counts, dtype=self.dtype)

    # replaces the traced kernel given above to histc, an op LTC lacks
    # (torch 2.11 refuses a second Python kernel without allow_override)
    _LIB.impl("histc", kernel, "Lazy", allow_override=True)
    _REPLACED.add(_qualified(op))


def _register_running_stats_written(op) -> None:
    """LTC's training ``native_batch_norm`` left the running statistics out of
    its IR (updated only as its kernel's side effect: lost, applied twice or
    read stale); a C++ kernel traces the functional variant and gives them
    its new values (lazy_backend/ltc_fixes/batch_norm_kernel.h)."""
    _C.register_batch_norm_kernel()
    _REPLACED.add(_qualified(op))


def _register_counted_nonzero(op) -> None:
    """LTC's ``nonzero`` runs eagerly (its size comes from data): traced with
    its count read first (data_dependent), without a C++ front."""
    _LIB.impl("nonzero", data_dependent.counted_nonzero, "Lazy")
    _REPLACED.add(_qualified(op))


def _register_unique_consecutive(op) -> None:
    """Without ``dim``, traced with its size read (data_dependent); with one, the eager path."""
    def kernel(*args, **kwargs):
        out = data_dependent.unique_consecutive(*args, **kwargs)
        return eager_fallback(op, args, kwargs) if out is NotImplemented else out

    _LIB.impl("unique_consecutive", kernel, "Lazy", allow_override=True)
    _REPLACED.add(_qualified(op))


LTC_REPLACED = {
    "pixel_shuffle": _register_composite_functionalized,
    "pixel_unshuffle": _register_composite_functionalized,
    "max_pool3d": _register_math_autograd,
    "max_pool3d_with_indices": _register_traced,
    "max_pool3d_with_indices_backward": _register_traced,
    "index_select": _register_index_select,
    "native_batch_norm": _register_running_stats_written,
    "histc": _register_histc_of_integers,
    "nonzero": _register_counted_nonzero,
    "unique_consecutive": _register_unique_consecutive,
}


def replaced_ops() -> list[str]:
    """LTC's own Lazy kernels replaced because they are wrong or not traced."""
    return sorted(_REPLACED)


def _cpu_batch_norm_shapes(decomposition):
    """torch._decomp's batch norm branches on the input's device: in eval mode
    it returns a non-CPU device's save_mean/save_invstd (the running stats);
    eager CPU returns empty ones. Lazy tensors are not "cpu": give CPU's
    results when the CPU backs the lazy device."""
    def run(input, weight, bias, running_mean, running_var, training, momentum, eps):
        out = decomposition(input, weight, bias, running_mean, running_var, training, momentum, eps)
        if training or torch._C._lazy._get_default_device_type().lower() != "cpu":
            return out
        return (out[0], input.new_zeros((0,)), input.new_zeros((0,)), *out[3:])

    return run


_DECOMPOSITION_WRAPPERS = {"aten::_native_batch_norm_legit_functional": _cpu_batch_norm_shapes}


def _multilabel_margin_loss_forward(input, target, reduction):
    """torch's own decomposition (2.13) adds the hinge terms of the target
    slots after a row's first -1 as if they named class 0: any row with a -1
    gets a larger loss than aten's kernel gives (torch.compile's too). Here
    those slots count for nothing. (loss, is_target) as aten's."""
    x, t = (input, target) if input.dim() == 2 else (input.unsqueeze(0), target.unsqueeze(0))
    classes = x.shape[1]
    idx = torch.arange(classes, device=t.device)
    end = torch.where(t == -1, idx, classes).amin(dim=-1, keepdim=True)
    valid = idx < end  # [N, C]: the target slots before the first -1
    is_target = (idx == torch.where(valid, t, -1).unsqueeze(-1)).any(dim=1)  # [N, C]
    picked = torch.gather(x, -1, torch.where(valid, t, 0))  # [N, C]: the targets' scores
    hinge = (1.0 - picked.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / classes  # [N, slot, class]
    hinge = torch.where(valid.unsqueeze(-1) & ~is_target.unsqueeze(1), hinge, 0)
    loss = hinge.sum(dim=(1, 2))
    if reduction == 1:  # mean
        loss = loss.mean()
    elif reduction == 2:  # sum
        loss = loss.sum()
    elif input.dim() < 2:
        loss = loss.reshape(())
    return loss, is_target.to(input.dtype).reshape(target.shape)


# Decompositions of ours, in place of torch's (see each one's reason).
_OWN_DECOMPOSITIONS = {"aten::multilabel_margin_loss_forward": _multilabel_margin_loss_forward}


# Activations the TS backend lacks that a mobile CNN calls every step
# (MobileNetV3 at the zoo's base size: 12 calls a step, 2.4 ms of its 8.3 ms
# per-op trace): a decomposition's several ops, re-entering
# functionalization in Python, cost ~0.2 ms a call, a builtin node fronted
# in C++ (kernel_fronts.h) ~10 us. Inductor decomposes them as it compiles.
_TRACED_AS_NODES = frozenset({"aten::hardswish", "aten::hardswish_backward", "aten::hardsigmoid_backward",
                              "aten::hardtanh_backward"})


def _register_functional(op) -> None:
    """Trace ``op`` through its aten-written decomposition, else as a builtin node."""
    from torch._decomp import decomposition_table

    qualified = _qualified(op)
    decomposition = _OWN_DECOMPOSITIONS.get(qualified, decomposition_table.get(op))
    if qualified in _DECOMPOSITION_WRAPPERS and decomposition is not None:
        decomposition = _DECOMPOSITION_WRAPPERS[qualified](decomposition)
    if decomposition is not None and _aten_written(decomposition) and qualified not in _TRACED_AS_NODES:
        _LIB.impl(qualified[len("aten::"):], _decomposed_kernel(op, decomposition), "Lazy")
        _DECOMPOSED.add(qualified)
    else:
        _LIB.impl(qualified[len("aten::"):], _builtin_kernel(op), "Lazy")
        _BUILTIN.add(qualified)
