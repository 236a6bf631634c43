"""Ops whose output sizes depend on tensor values, traced instead of run eagerly.

LTC gives every IR value static sizes, and these ops' sizes come from data:
``masked_select``, ``nonzero`` and indexing by a boolean mask return one row
per true element; the CTC loss's ``log_alpha`` (saved for its backward) is
as wide as the longest target. Each used to take the eager path: the step
traced so far executed, the op ran on the CPU, and its result came back as
new data (a Wav2Vec2 CTC step: 5 graph executions).

Two rules, by what the sizes depend on:

* **One count read on the host, at ``nonzero``**: the only op traced with
  a size read from data. ``masked_select`` and indexing by a boolean mask
  are written with it (the mask's ``nonzero`` gives integer indices, and the
  gather that follows has static sizes once the count is known), so each
  costs one count. The count (of the mask's nonzero elements) is computed
  on the lazy device and read: one small execution (the mask's ops only;
  the whole step when the mask depends on random draws, so they are drawn
  once; a mask computed again from the same data in the step is not read
  again), counted in ``metrics["syncs"]`` under "lazy_mlir reads how many
  elements ... selects" and the user's line. ``nonzero`` is then traced as a
  TorchScript builtin node of that size (``lazy_mlir::nonzero_contiguous``),
  kept in the glue graph (``cluster.compilable``); a count that changes
  from step to step changes the sizes downstream, which shape-generic code
  serves from the second count on (``compile.shape_generic``). The C++ front
  that reuses a call signature's sizes (``kernel_fronts.h``) is not put over
  ``nonzero`` and never takes a boolean index.
  ``repeat_interleave`` (the repeats' total), ``bincount`` (the largest
  value), ``unique`` and ``unique_consecutive`` without ``dim`` (how many runs
  of equal values, sorted or as given) read their size the same way.
* **A bound without a read** (the CTC loss): ``log_alpha`` is never seen by
  the user, only by the loss's backward, which reads no column past a
  target's own length. It is traced at a width every target fits (twice the
  targets' length, plus one: for concatenated targets their total), padded
  with ``-inf`` (``lazy_mlir::ctc_loss_padded_alpha``), so the loss and its
  gradient stay in the step's graph with no read at all.
"""
from __future__ import annotations

import math

import torch

from ..native import _C
from ..observe import syncs

aten = torch.ops.aten


# ------------------------------------------------------ nonzero, counted
def _read_size(value: torch.Tensor, what: str) -> int:
    """Lazy 0-d integer ``value`` read on the host, counted as a sync under ``what``."""
    with syncs.planned_read(f"lazy_mlir reads {what}"):
        # item() syncs the whole step first when the value depends on random
        # draws (value_reads.h): drawn once, the value with it
        return int(value.item())


# Counts read this step, by the mask's value key (_C.value_key): a mask
# computed again from the same data (each layer of a graph network removes
# the same self-loops) is not read again. The mask is held with its count
# (so its key's data cannot become another tensor's), until mark_step.
_counts: dict[int, tuple[torch.Tensor, int]] = {}
syncs.at_mark_step(_counts.clear)


def _count_true(mask: torch.Tensor, what: str) -> int:
    """How many elements of lazy ``mask`` are nonzero, read on the host once a step."""
    key = _C.value_key(mask)
    if key in _counts:
        return _counts[key][1]
    count = _read_size(aten.sum.default(aten.ne.Scalar(mask, 0)), f"how many elements {what} selects")
    if key:
        _counts[key] = mask, count
    return count


@torch.library.custom_op("lazy_mlir::nonzero_contiguous", mutates_args=(), device_types=("cpu", "cuda"))
def nonzero_contiguous(self: torch.Tensor) -> torch.Tensor:
    """aten's ``nonzero`` in row-major layout: aten's kernels return the
    (count, dims) result column-major, and a group input whose sizes change
    must be contiguous to be served by shape-generic code."""
    return aten.nonzero.default(self).contiguous()


@nonzero_contiguous.register_fake
def _(self):
    return self.new_empty((torch.library.get_ctx().new_dynamic_size(), self.dim()), dtype=torch.int64)


def counted_nonzero(self: torch.Tensor, what: str = "aten::nonzero") -> torch.Tensor:
    """``nonzero(self)`` as a builtin node whose size is read on the host
    (the Lazy kernel of ``nonzero``: LTC's runs it eagerly)."""
    count = _count_true(self, what)
    (indices,) = _C.trace_builtin("lazy_mlir::nonzero_contiguous", "default", [self],
                                  [(torch.int64, [count, self.dim()])], [])
    return indices


def _columns(indices: torch.Tensor, dims: int) -> list[torch.Tensor]:
    return [aten.select_copy.int(indices, 1, d) for d in range(dims)]


def boolean_indices_as_integers(indices: list, what: str) -> list:
    """``Tensor?[] indices`` with each boolean mask of k dims replaced by the
    k integer index tensors of its nonzero elements, as aten reads a mask;
    the list itself when no index is boolean, or one is 0-d (``x[True]``
    adds a dimension: no integer index does; the eager path takes it)."""
    masks = [t for t in indices if t is not None and t.dtype in (torch.bool, torch.uint8)]
    if not masks or any(t.dim() == 0 for t in masks):
        return indices
    out = []
    for t in indices:
        if t is not None and t.dtype in (torch.bool, torch.uint8):
            out += _columns(counted_nonzero(t, what), t.dim())
        else:
            out.append(t)
    return out


def masked_select(self, mask):
    """The Lazy kernel of ``masked_select``: the broadcast input gathered at
    the mask's nonzero positions (autograd, above, is aten's)."""
    sizes = list(torch.broadcast_shapes(self.shape, mask.shape))
    if not sizes:  # 0-d: as 1-element tensors
        self, mask, sizes = aten.view_copy.default(self, [1]), aten.view_copy.default(mask, [1]), [1]
    if list(self.shape) != sizes:
        self = aten.expand_copy.default(self, sizes)
    if list(mask.shape) != sizes:
        mask = aten.expand_copy.default(mask, sizes)
    indices = counted_nonzero(mask, "aten::masked_select")
    return aten.index.Tensor(self, _columns(indices, len(sizes)))


def repeat_interleave(repeats, output_size=None):
    """The Lazy kernel of ``repeat_interleave.Tensor``: its size (the repeats'
    total) read unless given, then aten's kernel in the graph."""
    if output_size is None:
        output_size = _read_size(aten.sum.default(repeats), "the size of aten::repeat_interleave's result")
    (out,) = _C.trace_builtin("aten::repeat_interleave", "Tensor", [repeats, output_size],
                              [(torch.int64, [output_size])], [])
    return out


def bincount(self, weights=None, minlength=0):
    """The Lazy kernel of ``bincount``: its size (the largest value + 1, at
    least ``minlength``) read, then aten's kernel in the graph."""
    largest = _read_size(aten.max.default(self), "the size of aten::bincount's result") if self.numel() else -1
    dtype = torch.bincount(torch.zeros(1, dtype=self.dtype),  # aten's rule for the result's dtype
                           weights=None if weights is None else torch.zeros(1, dtype=weights.dtype)).dtype
    (out,) = _C.trace_builtin("aten::bincount", "default", [self, weights, minlength],
                              [(dtype, [max(largest + 1, minlength)])], [])
    return out


def _distinct_in_order(flat: torch.Tensor, what: str) -> int:
    """How many runs of equal neighbours 1-D lazy ``flat`` has (NaN equals
    nothing, as in aten's unique), read on the host."""
    n = flat.shape[0]
    if n == 0:
        return 0
    changes = aten.ne.Tensor(aten.slice_copy.Tensor(flat, 0, 1, n), aten.slice_copy.Tensor(flat, 0, 0, n - 1))
    return _read_size(aten.add.Scalar(aten.sum.default(changes), 1), what)


def _unique_outputs(self, count: int, return_inverse: bool, return_counts: bool) -> list:
    # aten gives empty inverse and counts when not asked for
    return [(self.dtype, [count]), (torch.int64, list(self.shape) if return_inverse else [0]),
            (torch.int64, [count] if return_counts else [0])]


def unique(self, sorted=True, return_inverse=False, return_counts=False):
    """The Lazy kernel of ``_unique2`` (``torch.unique`` without ``dim``): how
    many distinct values (runs in the sorted values) read, then aten's kernel."""
    flat = aten.view_copy.default(self, [-1])
    count = _distinct_in_order(aten.sort.default(flat)[0], "how many distinct values aten::_unique2 returns")
    return tuple(_C.trace_builtin("aten::_unique2", "default", [self, sorted, return_inverse, return_counts],
                                  _unique_outputs(self, count, return_inverse, return_counts), []))


def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    """The Lazy kernel of ``unique_consecutive`` without ``dim`` (with one:
    NotImplemented, the eager path): the runs of equal neighbours read."""
    if dim is not None:
        return NotImplemented
    count = _distinct_in_order(aten.view_copy.default(self, [-1]),
                               "how many runs aten::unique_consecutive returns")
    return tuple(_C.trace_builtin("aten::unique_consecutive", "default", [self, return_inverse, return_counts, dim],
                                  _unique_outputs(self, count, return_inverse, return_counts), []))


# aten ops tagged with data-dependent sizes that are traced (the others take
# the eager path, named by lazy_kernels.uncovered_ops): here, and the CTC
# loss of host lengths (its meta kernel reads the lists)
TRACED = frozenset({"aten::nonzero", "aten::masked_select", "aten::index.Tensor", "aten::_ctc_loss.Tensor",
                    "aten::_ctc_loss", "aten::repeat_interleave.Tensor", "aten::bincount", "aten::_unique2",
                    "aten::unique_consecutive"})


# ------------------------------------------------------ CTC loss, bounded
@torch.library.custom_op("lazy_mlir::ctc_loss_padded_alpha", mutates_args=(), device_types=("cpu", "cuda"))
def ctc_loss_padded_alpha(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                          target_lengths: torch.Tensor, blank: int, zero_infinity: bool,
                          width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's ``_ctc_loss.Tensor``, its ``log_alpha`` padded with -inf to
    ``width`` columns (the backward reads none past 2 * target length + 1)."""
    loss, alpha = aten._ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
    return loss, torch.nn.functional.pad(alpha, (0, width - alpha.shape[-1]), value=-math.inf)


@ctc_loss_padded_alpha.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, width):
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    return log_probs.new_empty((batch,) if log_probs.dim() == 3 else ()), \
        log_probs.new_empty((batch, log_probs.shape[0], width))


def alpha_width(log_probs: torch.Tensor, targets: torch.Tensor) -> int:
    """Columns every target's ``log_alpha`` fits in: 2 * the longest possible
    target + 1 (padded targets (N, S): S; concatenated ones: their total)."""
    longest = targets.shape[-1] if targets.dim() == 2 or log_probs.dim() == 2 else targets.numel()
    return 2 * longest + 1


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """The Lazy kernel of ``_ctc_loss.Tensor``: one builtin node of
    ``ctc_loss_padded_alpha`` (autograd, above this kernel, is aten's: it
    hands the padded ``log_alpha`` to ``_ctc_loss_backward.Tensor``)."""
    width = alpha_width(log_probs, targets)
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    loss_sizes = [batch] if log_probs.dim() == 3 else []
    outputs = [(log_probs.dtype, loss_sizes), (log_probs.dtype, [batch, log_probs.shape[0], width])]
    loss, alpha = _C.trace_builtin("lazy_mlir::ctc_loss_padded_alpha", "default",
                                   [log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, width],
                                   outputs, [])
    return loss, alpha
