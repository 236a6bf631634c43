"""Buffer donation inside a fusion group: outputs written into the storage of
inputs that are dead after the step (parameters, gradients and optimizer
state that the step overwrites), instead of into fresh tensors.

The C++ backend decides which inputs may be written (see
``lazy_backend/memory/buffer_donation.h``): a group's donor candidates are graph
inputs that no other group, TorchScript op or graph output uses; at each
execution it hands the group only buffers nothing else can still read, and
a copy of any other. This module does the group's half: in the FX graph
exported from MLIR, it pairs each donated input with an output of the same
shape, dtype and (contiguous) layout and ends the graph with
``aten.copy_(input, output)``, returning the input. Inductor keeps that as an
input mutation and, for a pointwise result (AdamW's updates), computes it
straight into the input's buffer: no allocation, no copy.

An output is not written into an input whose elements it reads at other
indices within the ops Inductor fuses into the writing kernel (a view, a
gather, a concatenation of the input: ``x.copy_(channel_shuffle(x))``
would overwrite elements still to be read); reads through an op computed
into a buffer of its own first (a product, a reduction) are safe. An input
is not donated when an output aliases it (a view of its old value would
see the new one), when its tensor is not dense and contiguous, not
floating-point (token ids, masks: never state a step overwrites), or when it
is 0-d. Those last three are dropped before the group's cache key is made
(``GroupExecutable._first_run``): a group that reads its batch elsewhere in
its first step only keeps one key. Positions that hold one tensor (LTC
passes a weight read by the forward and by its update twice) are read
through one placeholder, so that Inductor orders every read of the buffer
before its write.
"""
from __future__ import annotations

import collections
import dataclasses
import operator

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

# How far (in FX nodes) an output may lie from the input it is written into:
# an optimizer update is a few pointwise ops from its state.
MAX_DISTANCE = 32

# Ops whose element i reads other elements of their input than i (views,
# gathers, concatenations), or that write elements at other indices than
# they read (scatters): Inductor inlines them into the kernel that reads
# their result as index arithmetic, or scatters into the output buffer.
# Where that buffer is the input's own, elements still to be read are
# overwritten (torch 2.13's Inductor computes x.copy_(channel_shuffle(x))
# in place, wrongly).
_REMAPPING = {"view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "slice", "select",
              "squeeze", "unsqueeze", "flip", "roll", "channel_shuffle", "pixel_shuffle", "pixel_unshuffle",
              "as_strided", "diagonal", "index", "index_select", "gather", "take", "take_along_dim", "embedding",
              "narrow", "unfold", "repeat", "cat", "stack", "constant_pad_nd", "alias", "movedim", "split",
              "split_with_sizes", "unbind", "chunk", "tril", "triu", "rot90", "_reshape_alias",
              "index_put", "_unsafe_index_put", "scatter", "scatter_add", "scatter_reduce", "index_add",
              "index_copy", "index_fill", "masked_scatter", "put", "slice_scatter", "select_scatter",
              "diagonal_scatter", "as_strided_scatter"}


# Element i from element i, though not tagged pointwise (a copy's, a cast's)
_ELEMENTWISE = {torch.ops.aten.copy.default, torch.ops.aten._to_copy.default}


def _kind(node: fx.Node) -> str:
    """How ``node`` reads its inputs, for the write-after-read check: "same"
    (element i from elements i: pointwise ops, a tuple's item), "remap"
    (other elements, inlined by Inductor: _REMAPPING) or "own" (an op
    Inductor computes into a buffer of its own first: products,
    convolutions, reductions, anything else)."""
    target = node.target
    if target is operator.getitem:
        return "same"
    if not isinstance(target, torch._ops.OpOverload):
        return "own"
    if torch.Tag.pointwise in target.tags or target in _ELEMENTWISE:
        return "same"
    name = target.overloadpacket.__name__
    return "remap" if name in _REMAPPING or name.removesuffix("_copy") in _REMAPPING else "own"


def _reads_elsewhere(donor: list[fx.Node], output: fx.Node) -> bool:
    """Whether ``output`` reads the donor's elements at other indices than
    its own within the ops Inductor may fuse into the kernel that writes it:
    on a path from the donor through "same" and "remap" ops (an "own" op
    ends a path: its result is a buffer of its own)."""
    stack, seen = [(n, False) for n in donor], set()
    while stack:
        node, remapped = stack.pop()
        for user in node.users:
            kind = _kind(user) if user.op == "call_function" else "own"
            if kind == "own":
                continue
            moved = remapped or kind == "remap"
            if user is output and moved:
                return True
            if (user, moved) not in seen:
                seen.add((user, moved))
                stack.append((user, moved))
    return False


@dataclasses.dataclass(frozen=True)
class Donation:
    position: int  # the group input written into
    output: int    # the first group output that now returns it


def writable(t) -> bool:
    """Whether an input could take an output: floating-point state (what a
    step overwrites: parameters, gradients, optimizer moments), dense and
    contiguous, not 0-d."""
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0 and t.numel() > 0
            and t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _storage(node: fx.Node):
    val = node.meta.get("val")
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def write_into_inputs(gm: fx.GraphModule, positions, inputs: list) -> list[Donation]:
    """Rewrites ``gm`` (a static-shape exported group) so that outputs are
    written into the inputs at ``positions`` where that is possible; returns
    what it did. ``inputs`` are the real tensors of the group's first run."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = list(output.args[0])
    allowed = set(positions)

    # Positions holding one tensor: all must be offered, the first reads for all.
    same: dict[int, list[int]] = collections.defaultdict(list)
    for i, t in enumerate(inputs):
        same[id(t)].append(i)
    donors: dict[int, list[int]] = {}  # representative position -> all its positions
    for k in sorted(allowed):
        if k >= len(placeholders) or k >= len(inputs) or not writable(inputs[k]):
            continue
        group = same[id(inputs[k])]
        if group[0] != k or not all(i in allowed for i in group):
            continue
        donors[k] = group

    # Storages that outputs alias: a donor whose storage an output views stays
    # unwritten; an output that aliases any input or another output is no target.
    out_storages = collections.Counter()
    for node in dict.fromkeys(n for n in returned if isinstance(n, fx.Node)):
        if _storage(node) is not None:
            out_storages[_storage(node)] += 1
    input_storages = {_storage(p) for p in placeholders}
    donors = {k: group for k, group in donors.items()
              if not any(_storage(placeholders[i]) in out_storages for i in group)}
    if not donors:
        return []

    def fits(node: fx.Node, donor: torch.Tensor) -> bool:
        val = node.meta.get("val")
        return (isinstance(val, torch.Tensor) and node.op == "call_function"
                and tuple(val.shape) == tuple(donor.shape) and val.dtype == donor.dtype
                and val.device == donor.device and val.is_contiguous()
                and _storage(node) not in input_storages and out_storages[_storage(node)] == 1)

    targets = {n for n in returned if isinstance(n, fx.Node)}
    candidates = []  # (distance, donor position, output node)
    for k, group in donors.items():
        starts = [placeholders[i] for i in group]
        seen = set(starts)
        frontier, distance = list(starts), 0
        while frontier and distance < MAX_DISTANCE:
            distance += 1
            nxt = []
            for node in frontier:
                for user in node.users:
                    if user not in seen and user.op != "output":
                        seen.add(user)
                        nxt.append(user)
                        if user in targets and fits(user, inputs[k]) and not _reads_elsewhere(starts, user):
                            candidates.append((distance, k, user))
            frontier = nxt
    candidates.sort(key=lambda c: (c[0], c[1]))

    done: list[Donation] = []
    used_donors, used_outputs = set(), set()
    for _, k, node in candidates:
        if k in used_donors or node in used_outputs:
            continue
        used_donors.add(k)
        used_outputs.add(node)
        target = placeholders[k]
        for i in donors[k][1:]:  # every read of the buffer through one placeholder
            placeholders[i].replace_all_uses_with(target)
        with graph.inserting_before(output):
            written = graph.call_function(torch.ops.aten.copy_.default, (target, node))
        written.meta["val"] = target.meta["val"]
        returned = [written if r is node else r for r in returned]
        done.append(Donation(k, next(i for i, r in enumerate(returned) if r is written)))
    output.args = (tuple(returned),)
    graph.lint()
    gm.recompile()
    return sorted(done, key=lambda d: d.position)
