"""Lazy-key kernels for ops the TorchScript LTC backend cannot trace.

The stock backend sends such ops to its eager fallback, which executes the
pending graph, runs the op on the CPU and uploads the result: one graph
execution per call (AdamW's ``lerp``: 53 per step). Worse, for ops returning
tensor lists (``split_copy``, ``unbind_copy``) the fallback hands back CPU
tensors. We register kernels on the ``Lazy`` dispatch key instead, so these
ops are traced into the graph as aten ops the backend has:

* hand-written kernels for the ops we know users hit (below);
* every other op whose Lazy entry is the eager fallback but which has an
  entry in ``torch._decomp.decomposition_table`` is traced through that
  decomposition. A decomposition that raises on lazy tensors or returns
  non-lazy tensors is not trusted again: the op then takes the eager path,
  counted in ``lazy_mlir.metrics`` under its name.

Kernels are registered below autograd, so derivatives stay aten's own.
"""
from __future__ import annotations

import threading
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import metrics

aten = torch.ops.aten
_LIB: torch.library.Library | None = None
_reentry = threading.local()
_untrusted: set[str] = set()  # ops whose decomposition failed on lazy tensors


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


HAND_WRITTEN = {
    "split_copy.Tensor": _split_copy,
    "split_with_sizes_copy": _split_with_sizes_copy,
    "unbind_copy.int": _unbind_copy,
    "lerp.Scalar": _lerp_scalar,
    "lerp.Tensor": _lerp_tensor,
}


# ------------------------------------------------------------ decompositions
def _falls_back_on_lazy(qualified_name: str) -> bool:
    """True when the op's Lazy dispatch entry is the TS eager fallback."""
    for line in torch._C._dispatch_dump_table(qualified_name).splitlines():
        if line.startswith("Lazy:"):
            return "[backend fallback]" in line
    return True


def _is_traceable_functional(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return False  # functionalization never sends in-place, out= or view ops here
    if torch.Tag.nondeterministic_seeded in op.tags:
        return False  # random ops must keep their RNG semantics
    return any(isinstance(a.type, (torch.TensorType, torch.ListType)) for a in schema.arguments)


def _is_lazy(x) -> bool:
    return not isinstance(x, torch.Tensor) or x.device.type == "lazy"


def eager_fallback(op, args, kwargs):
    """Run ``op`` on the CPU and move its results back: what LTC's own fallback
    does (it executes the pending graph), but counted under the op's name."""
    metrics.count_fallback(str(op))
    devices = [t.device for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.device.type == "lazy"]
    device = devices[0] if devices else torch.device("lazy")
    to_cpu = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x
    out = op(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, out)


def _decomposed_kernel(op, decomposition):
    name = str(op)

    def kernel(*args, **kwargs):
        active = getattr(_reentry, "ops", None)
        if active is None:
            active = _reentry.ops = set()
        if name in _untrusted or name in active:
            return eager_fallback(op, args, kwargs)
        active.add(name)
        try:
            out = decomposition(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure means: don't trust it
            reason = f"{type(exc).__name__}: {exc}"
            out = None
        else:
            reason = None if all(_is_lazy(x) for x in tree_flatten(out)[0]) else "returned non-lazy tensors"
        finally:
            active.discard(name)
        if reason is not None:
            _untrusted.add(name)
            warnings.warn(f"lazy_mlir: decomposition of {name} failed on the lazy device ({reason}); "
                          "it runs through the eager fallback from now on", RuntimeWarning, stacklevel=2)
            return eager_fallback(op, args, kwargs)
        return out

    return kernel


def decomposed_ops() -> list[str]:
    """Ops traced through a torch._decomp decomposition (registered by install())."""
    return sorted(_DECOMPOSED)


_DECOMPOSED: set[str] = set()


def install() -> None:
    """Register all Lazy-key kernels. Idempotent."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    for name, fn in HAND_WRITTEN.items():
        _LIB.impl(name, fn, "Lazy")
    from torch._decomp import decomposition_table

    for op, decomposition in decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        overload = op._schema.name.split("::")[1] + (f".{op._overloadname}" if op._overloadname != "default" else "")
        if overload in HAND_WRITTEN or not _is_traceable_functional(op):
            continue
        qualified = op._schema.name + (f".{op._overloadname}" if op._overloadname != "default" else "")
        if not _falls_back_on_lazy(qualified):
            continue
        _LIB.impl(overload, _decomposed_kernel(op, decomposition), "Lazy")
        _DECOMPOSED.add(qualified)
