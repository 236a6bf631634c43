"""Whole-module capture: a module's forward and backward traced once, then
replayed as one IR node each (``lazy_mlir.capture(model)``).

Without it, a lazy step re-runs the model's Python every step, and each op
pays Python, autograd, functionalization and LTC before it is one IR node:
~8 us an op against ~2 us eagerly, and a few hundred ops make a small
model's step. A captured module records its forward and its backward once,
as FX graphs of aten ops (AOTAutograd on fake tensors of the lazy device),
and each later call traces one ``RegionNode`` per graph (region_node.h),
whose lowering emits those ops as TorchScript builtins. The step's graph,
its clustering, compiles and TorchScript fallbacks are the ones a per-op
trace builds, with view ops as their ``_copy`` variants as functionalization
traces them; random ops keep their order, so dropout draws what eager draws.

What a replay assumes. A replay runs none of the forward's Python: every
decision that Python made from Python values while recording is replayed
as made. A record is therefore keyed by everything capture can see that a
forward may depend on besides tensor values, and any change records again
(up to RECORD_LIMIT records per module, then new keys run op by op, with a
warning naming the part of the key that changed):

- the arguments' structure, dtypes, shapes and non-tensor values;
- the module tree's parameters and buffers (which tensors, their dtypes,
  shapes and requires_grad; a replaced submodule);
- the plain attributes of every module in the tree (``m.__dict__`` values
  that are bool, int, float, str, None, a torch dtype or device, or tuples
  of those): ``model.use_cache = False`` between steps records again; and
  the plain fields of the objects those modules hold (a model's config:
  ``model.config.output_hidden_states = True`` records again);
- the plain globals that user code read while recording (LOAD_GLOBAL names
  of the code objects that ran, outside torch, lazy_mlir and the standard
  library, and ``config.FLAG`` of a user's module ``config``): flipping a
  module-level flag records again, flipping it back replays the first
  record;
- grad mode, autocast state, train/eval;
- how many of the module's repeated blocks a memory budget checkpoints
  (``memory_budget``: recorded as ``checkpoint`` regions, recomputed in
  the backward).

Checking them costs one C++ call per call (``_C.StateEntries``: each entry
still the same object); the key's values are rebuilt only when one is not.

What capture refuses. A forward that, while recorded, changes a module's
attribute (a counter, a cache: ``self.calls += 1``), assigns a buffer
(``self.buf = t`` rather than ``self.buf.copy_(t)``), writes a global (or
a user module's attribute), or draws from Python's ``random`` (its global
generator or a ``random.Random`` of its own) or NumPy's global generator
would have that effect at the record only, and twice (AOTAutograd runs
the forward twice). A write that a second record repeats unchanged (the
same value at every call: a dtype kept, a warn-once flag) is kept, and the
module captured; any other makes it refused: the Python state is put back
as it was before the record, a warning names what changed (and the line
of a write or of a draw from Python's random), and its forward runs op by
op at every call from then on, so that it runs once a call, as eagerly.
A forward that cannot be recorded (Python that reads tensor values, an op
without an aten schema) runs op by op, with a warning that names the
error, and is not tried again for that key.

What capture cannot see (capture, on by default, assumes these do not
change what the forward computes): fields of objects held more than one
level below a module (``self.config.sub.flag``), values inside containers,
closures' cells and default arguments, globals read by torch or library
code outside the user's, module attributes read through more than one dot,
non-plain values (an enum, an object) whose state changes, the time, the environment, files, and mutations the forward makes
to objects other than modules, globals and Python's random generators
(appending to a global list, editing a config object, drawing from a NumPy
``Generator`` of its own).

A call replays without AOTAutograd's runtime wrappers (one autograd node of
our own over the two regions, ``_Direct``) where those would only pass
values through: outputs that are fresh floating-point tensors with
gradients, no input returned as a view. The backward graph is recorded with
the forward (a backward on the fake outputs), so that the first step replays
as every later one.

A function of modules can be captured too (``capture(loss_fn,
modules=[model])``): the loss outside the model is then in the node, with
its backward, instead of traced op by op each step (a third of a small
transformer's step outside the generated code).

Why one module of ~730 lines: a record's regions, its direct replay and
``CapturedForward``'s keyed records are one mechanism; what a record may
depend on and may not do is ``python_state``.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import operator
import re
import sys
import threading
import traceback
import unittest.mock
import warnings

import torch
import torch.utils.checkpoint
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import config
from ..cluster import compilable
from ..compile import background
from ..native import _C
from ..observe import metrics, syncs
from . import autocast, device_module, transformers_compat
from .lazy_kernels import HAND_WRITTEN
from .python_state import NamedState, PythonState, Values


class CaptureError(RuntimeError):
    """A recorded graph that cannot be replayed as a region (names the op)."""


# ------------------------------------------------------------------ regions
def _copy_variant(op):
    """``view_copy`` for ``view`` and so on: what functionalization traces
    for a view op, and what the rest of the pipeline expects (every lazy
    value is contiguous; a view of a transposed value is not)."""
    if not op.is_view:
        return op
    name = op._schema.name.split("::")[1]
    packet = getattr(torch.ops.aten, f"{name}_copy", None)
    copy = getattr(packet, op._overloadname, None) if packet is not None else None
    if copy is None:
        raise CaptureError(f"view op {op} has no _copy variant")
    return copy


def _backing(value):
    """A device argument names the device behind the lazy one: the
    TorchScript graph runs there (what LTC's own lowering does)."""
    if isinstance(value, torch.device) and value.type == "lazy":
        return torch.device(device_module.backing_device())
    return value


def _output_sizes(node: torch.fx.Node) -> list[int]:
    """How ``node``'s returns flatten: -1 per tensor, n per n-tensor list."""
    returns = node.target._schema.returns
    vals = [node.meta.get("val")] if len(returns) == 1 else node.meta.get("val")
    sizes = []
    for formal, val in zip(returns, vals):
        if isinstance(formal.type, torch.ListType):
            sizes.append(len(val))
        elif isinstance(val, torch.Tensor) or val is None:  # None: an output not asked for (convolution_backward)
            sizes.append(-1)
        else:
            raise CaptureError(f"{node.target} returns {type(val).__name__}, not a tensor")
    return sizes


def _decomposition(op) -> torch.fx.GraphModule | None:
    """The op's entry in lazy_kernels' ``HAND_WRITTEN`` table (split and
    unbind as one ``slice_copy``/``select_copy`` per piece, lerp, eye), or
    None. The per-op trace runs those kernels on the lazy device; a region
    emits what they emit, so a replay builds the per-op trace's graph (a
    ``Tensor[]`` op, as ``split`` was here first, ends a fusion group)."""

    name = op._schema.name.split("::")[1] + ("" if op._overloadname == "default" else f".{op._overloadname}")
    return HAND_WRITTEN.get(name)


def _decomposed(node: torch.fx.Node, kernel, tensors: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """``kernel`` run on ``node``'s arguments, traced as an FX graph whose
    placeholders are ``tensors``, the node's tensor arguments in order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()) or any(
            isinstance(a, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in a) for a in node.args):
        raise CaptureError(f"{node.target}: tensor arguments other than positional ones")

    def run(*values):
        it = iter(values)
        args = [next(it) if isinstance(a, torch.fx.Node) else a for a in node.args]
        return kernel(*args, **{k: _backing(v) if k == "device" else v for k, v in node.kwargs.items()})

    return make_fx(run)(*(a.meta["val"] for a in tensors))


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)', re.MULTILINE)


def _frames_without_text(tb, skip):
    """torch's ``_extract_symbolized_tb`` (how make_fx's stack traces are
    made) without each frame's source text: the text read every source file
    of the forward's frames, torch's among them, into linecache for the
    process's life, and a copy of every frame's line into each node's trace
    (a ResNet's record: ~9 MB); ``_source_of`` needs file, line and function."""
    return traceback.StackSummary.from_list(
        [traceback.FrameSummary(f["filename"], f["line"], f["name"], lookup_line=False, line="")
         for f in reversed(tb[skip:])])


def _source_of(node: torch.fx.Node) -> str | None:
    """"file function line" of the innermost user frame that traced ``node``
    (the record keeps stack traces: see _record), as the per-op trace names
    an op's line; None for ops no user line made (a backward's)."""
    where = None
    for frame in _FRAME.finditer(node.meta.get("stack_trace") or ""):
        if not frame["file"].startswith(syncs.INTERNAL_DIRS) and not frame["file"].startswith("<"):
            where = f"{frame['file']} {frame['function']} {frame['line']}"
    return where


def build_region(gm: torch.fx.GraphModule, name: str):
    """Converts an FX graph of aten ops into a region. Returns (region, the
    graph's tensor constants: the region's inputs after the placeholders,
    for each graph output its region output index or None, the inputs the
    graph writes: (placeholder index, region output index) pairs, the
    region outputs that are draws nothing reads)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
    values: dict[torch.fx.Node, object] = {n: i for i, n in enumerate(placeholders + constants)}
    count = len(values)
    ops, writes = [], []

    def index(arg, op):
        if not isinstance(arg, torch.fx.Node) or not isinstance(values.get(arg), int):
            raise CaptureError(f"{op}: argument {arg!r} is not a tensor of the graph")
        return values[arg]

    def add(node, source=None):
        nonlocal count
        source = source or _source_of(node)
        if node.target is operator.getitem:
            values[node] = values[node.args[0]][node.args[1]]
            return
        if not isinstance(node.target, torch._ops.OpOverload):
            raise CaptureError(f"{node.target} is not an aten op")
        if node.target.overloadpacket is torch.ops.aten._assert_async:
            # a check of a value that fake tensors cannot see (one_hot's
            # "class values must be non-negative"): the per-op trace makes
            # none either (a read per step), so neither does its region
            return
        if node.target is torch.ops.aten.copy_.default and node.args[0] in placeholders and not node.users:
            # An input the forward writes (BatchNorm's running stats), copied
            # into at the graph's end: the region returns the value, and
            # _Replay updates the input with it in one call.
            target, value = node.args[0], node.args[1]
            if (target.meta["val"].shape, target.meta["val"].dtype) != (value.meta["val"].shape, value.meta["val"].dtype):
                raise CaptureError(f"copy_ into input {target} changes its shape or dtype")
            writes.append((placeholders.index(target), value))
            return
        op = _copy_variant(node.target)
        kernel = _decomposition(op)
        if kernel is not None:  # what its lazy kernel emits, op by op
            tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
            sub = _decomposed(node, kernel, tensors)
            inner = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for placeholder, arg in zip(inner, tensors):
                values[placeholder] = values[arg]
            for n in sub.graph.nodes:
                if n.op == "call_function":
                    add(n, source)
                elif n.op == "output":
                    result = n.args[0]
                    values[node] = ([values[r] for r in result] if isinstance(result, (list, tuple))
                                    else values[result])
                elif n.op != "placeholder":
                    raise CaptureError(f"{node.target}'s decomposition has a {n.op} node")
            return
        arguments = []
        for i, formal in enumerate(op._schema.arguments):
            if i < len(node.args):
                value = node.args[i]
            elif formal.name in node.kwargs:
                value = node.kwargs[formal.name]
            elif formal.has_default_value():
                value = formal.default_value
            else:
                raise CaptureError(f"{op}: missing argument {formal.name}")
            if isinstance(value, torch.fx.Node):
                arguments.append(("value", index(value, op)))
            elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
                arguments.append(("values", [None if v is None else index(v, op) for v in value]))
            else:
                arguments.append(("constant", _backing(value)))
        sizes = _output_sizes(node)
        returns = []
        for n in sizes:
            returns.append(count if n < 0 else list(range(count, count + n)))
            count += 1 if n < 0 else n
        values[node] = returns[0] if len(sizes) == 1 else returns
        # native_dropout's lowering needs its sizes (lazy_backend/ltc_fixes/dropout_masks.h)
        val = node.meta["val"][0] if op is torch.ops.aten.native_dropout.default else None
        ops.append((op._schema.name, op._overloadname, arguments, sizes if any(n >= 0 for n in sizes) else [],
                    sum(1 if n < 0 else n for n in sizes), None if val is None else (val.dtype, list(val.shape)),
                    source))

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if node.op != "call_function":
            raise CaptureError(f"unsupported FX node {node.op} {node.target}")
        add(node)

    (results,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    outputs, positions, shapes = [], [], []
    for result in results:
        if result is None:  # a backward's gradient for an input that needs none
            positions.append(None)
            continue
        val = result.meta["val"]
        positions.append(len(outputs))
        outputs.append(index(result, "output"))
        shapes.append((val.dtype, list(val.shape)))
    written = []
    for placeholder, value in writes:
        written.append((placeholder, len(outputs)))
        outputs.append(index(value, "copy_"))
        shapes.append((value.meta["val"].dtype, list(value.meta["val"].shape)))
    # A draw nothing reads (an unused dropout) still moves the generator on
    # eagerly: an output of its own, which _Replay keeps for the step's sync
    # (the region's lowering would drop it, and every later draw would take
    # other numbers than eager's).
    dead_draws = []
    for node in gm.graph.nodes:
        if _draws(node) and not any(u.users if u.target is operator.getitem else True for u in node.users):
            val = node.meta["val"]
            piece = 1 if isinstance(val, (tuple, list)) else None  # native_dropout: its mask, the draw alone
            dead_draws.append(len(outputs))
            outputs.append(values[node] if piece is None else values[node][piece])
            val = val if piece is None else val[piece]
            shapes.append((val.dtype, list(val.shape)))
    region = _C.make_region(name, len(placeholders) + len(constants), ops, outputs, shapes)
    return region, [getattr(gm, n.target) for n in constants], positions, written, dead_draws


def _draws(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an op that draws random numbers."""
    return isinstance(node.target, torch._ops.OpOverload) and node.target._schema.name in compilable.RANDOM_OPS


class _Replay:
    """What AOTAutograd calls for a forward or backward graph: the graph
    itself on fake tensors (while recording), one region node on lazy ones."""

    _boxed_call = True  # AOTAutograd passes the arguments as one list

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.gm = gm
        self.region, constants, self.positions, self.written, self.dead_draws = build_region(gm, name)
        for node in gm.graph.nodes:  # the region named its ops' lines: the graph is kept for its structure
            node.meta.pop("stack_trace", None)
        with torch._subclasses.fake_tensor.unset_fake_temporarily():  # AOTAutograd compiles under its fake mode
            # pending device data until the first replay's sync, which gives
            # them their data (lazy_backend/ltc_fixes/pending_data.h): no graph root
            self.constants = [c.to("lazy") for c in constants]

    def __call__(self, args: list):
        if recording():  # the graph itself, on fakes: factory ops fake too
            with torch._guards.detect_fake_mode(args):
                return self.gm(*args)
        results = self.run(args)
        args.clear()  # boxed convention: the inputs are not held past the call
        return results

    def run(self, args) -> tuple:
        """The region traced on lazy ``args``: the graph's outputs, the inputs
        it writes updated."""
        outs = _C.trace_region(self.region, [*args, *self.constants])
        self._write(args, outs)
        self._keep_dead_draws(outs)
        return tuple(None if p is None else outs[p] for p in self.positions)

    def run_saving(self, args, n_user: int) -> tuple[list, "_C.SavedValues"]:
        """A direct replay's forward (every graph output a region output, in
        order): its first ``n_user`` outputs, and what the backward needs:
        the values it saves, held as lazy tensors only, and the inputs that
        are leaves (region_node.h)."""
        n_saved = len(self.positions) - n_user
        outs, saved = _C.trace_region_saving(self.region, [*args, *self.constants], n_user, n_user + n_saved)
        self._write(args, outs, removed=n_saved)  # outs: the user's outputs, then the written values
        self._keep_dead_draws(outs, removed=n_saved)
        return outs[:n_user], saved

    def _keep_dead_draws(self, outs, removed: int = 0) -> None:
        if self.dead_draws:
            _C.keep_dead_draws([outs[k - removed] for k in self.dead_draws])

    def _write(self, args, outs, removed: int = 0) -> None:
        """The inputs the graph writes updated with their new values (region
        outputs, ``removed`` fewer before them in ``outs``)."""
        if self.written:
            _C.functional_replace([args[i] for i, _ in self.written],
                                  _C.functional_values([outs[k - removed] for _, k in self.written]))


# ------------------------------------------------------------ direct replay
class _Direct(torch.autograd.Function):
    """A record's forward and backward regions under one autograd node of
    our own, without AOTAutograd's runtime wrappers (a third of a captured
    call's time on a small model): for records whose outputs are all fresh
    floating-point tensors that get a gradient (a loss, logits), see
    :func:`_replays_directly`."""

    @staticmethod
    def forward(ctx, record, *inputs):
        # the saved values only reach the backward's region: held as lazy
        # tensors, no tensor or SavedVariable each, and dropped by the
        # backward (unless retain_graph), so that the step's graph does not
        # also return every activation because the loss still holds them at
        # mark_step (see _C.SavedValues)
        outputs, ctx.saved = record.replays["forward"].run_saving(inputs, record.n_user)
        ctx.record = record
        ctx.set_materialize_grads(False)  # an output nothing used gets None: see _direct_backward
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        # backward(create_graph=True) runs with grad mode on, which once_differentiable turns off inside
        ctx.create_graph = torch.is_grad_enabled()
        return _direct_backward(ctx, *grads)


@torch.autograd.function.once_differentiable
def _direct_backward(ctx, *grads):
    # the parameters' gradients skip AccumulateGrad's detach where it would
    # store them as is (unless create_graph: it then stores a clone)
    backward, record = ctx.record.replays["backward"], ctx.record
    positions = backward.positions
    unused = {i for i, grad in enumerate(grads) if grad is None}
    if unused:
        # An input whose gradient comes only from outputs nothing used gets
        # None, as eagerly, where autograd never reaches it (not zeros: the
        # optimizer would step it, decaying its weights); the region takes
        # zeros for those outputs, one tensor per shape (a Hugging Face
        # decoder's unused key/value caches: one traced node, not one each).
        positions = [None if sources <= unused else p for p, sources in zip(positions, record.gradient_sources)]
        device = next(grad.device for grad in grads if grad is not None)
        zeros: dict = {}
        grads = [grad if i not in unused else _zeros_like(record.outputs[i], device, zeros)
                 for i, grad in enumerate(grads)]
    return (None, *_C.replay_backward(backward.region, ctx.saved, grads, backward.constants, positions,
                                      ctx.create_graph))


def _zeros_like(output, device, made: dict) -> torch.Tensor:
    key = (tuple(output.shape), output.dtype)
    if key not in made:
        made[key] = torch.zeros(key[0], dtype=key[1], device=device)
    return made[key]


def _gradient_sources(backward: torch.fx.GraphModule) -> list[frozenset]:
    """For each gradient the backward graph returns, the tangents (indices
    of the forward's outputs) it depends on."""
    tangents = [n for n in backward.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    sources = {n: frozenset([i]) for i, n in enumerate(tangents)}
    for node in backward.graph.nodes:
        if node not in sources:
            sources[node] = frozenset().union(*(sources[arg] for arg in node.all_input_nodes))
    (results,) = [n.args[0] for n in backward.graph.nodes if n.op == "output"]
    return [sources[r] if isinstance(r, torch.fx.Node) else frozenset() for r in results]


def _replays_directly(forward: "_Replay", backward: "_Replay", outputs: list) -> bool:
    """Whether AOTAutograd's wrappers would do nothing but pass values
    through: the forward graph returns the user's outputs (``outputs``:
    their fakes) then exactly what the backward graph takes before its
    tangents, and the backward writes no input; every output is a
    floating-point tensor with a tangent, none a view of an input
    (AOTAutograd regenerates those), and the backward returns one gradient
    per forward input."""
    n_user = len(outputs)
    fw_inputs = [n for n in forward.gm.graph.nodes if n.op == "placeholder"]
    (fw_results,) = [n.args[0] for n in forward.gm.graph.nodes if n.op == "output"]
    bw_inputs = [n for n in backward.gm.graph.nodes if n.op == "placeholder"]
    (bw_results,) = [n.args[0] for n in backward.gm.graph.nodes if n.op == "output"]
    tangents = [n for n in bw_inputs if n.name.startswith("tangents")]
    n_saved = len(bw_inputs) - len(tangents)
    if (len(tangents) != n_user or bw_inputs[n_saved:] != tangents or len(fw_results) != n_user + n_saved
            or len(bw_results) != len(fw_inputs) or any(p is None for p in forward.positions) or backward.written):
        return False
    if not all(isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad for o in outputs):
        return False
    for result in fw_results[:n_user]:
        node = result
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and getattr(node.target, "is_view", False):
            node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.op == "placeholder":
            return False
    return True


def _record_backward(outputs) -> None:
    """AOTAutograd records a backward graph at its first call: a backward on
    the fake outputs records it now, so that the first real call can already
    replay directly (its graph is then every later step's). A backward that
    fails here is left to record at its first real call."""
    grads = [o for o in tree_flatten(outputs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not grads or not torch.is_grad_enabled():
        return
    try:
        torch.autograd.backward(grads, [torch.ones_like(o) for o in grads])
    except CaptureError:
        raise
    except Exception:  # noqa: BLE001 - not needed to replay; AOTAutograd records it later
        pass


def _check_backward_draws_nothing(backward: torch.fx.GraphModule) -> None:
    """A backward draws random numbers only where it recomputes a forward
    (checkpointing): eagerly the recompute sets the generator back to draw
    the forward's numbers again and then restores it, so it consumes none.
    A replay's backward would draw anew: unused draws (AOTAutograd's
    partitioner leaves recomputes whose values the forward saved) are
    removed, a used one refuses the record (other masks than the forward's)."""
    removed = False
    for node in reversed(list(backward.graph.nodes)):
        unused_piece = node.target is operator.getitem and _draws(node.args[0]) and not node.users
        if (_draws(node) or unused_piece) and not node.users:
            backward.graph.erase_node(node)
            removed = True
        elif _draws(node):
            raise CaptureError(f"its backward draws random numbers ({node.target}: a recompute, as activation "
                               "checkpointing's), which a replay would draw anew")
    if removed:
        backward.recompile()


class _Record:
    """One key's AOTAutograd function (``aot``), called until its backward
    has been recorded too; from then on replayed directly (``_Direct``)
    where :func:`_replays_directly` allows. (The key holds grad mode: a
    record with a backward is always called with grad enabled.)"""

    def __init__(self):
        self.aot = None
        self.replays: dict[str, _Replay] = {}  # "forward"/"backward", as AOTAutograd compiles them
        self.outputs, self.out_spec = None, None  # the forward's outputs on fakes, flattened
        self.direct: bool | None = None  # None: not decided (no backward recorded yet)
        self.gradient_sources: list[frozenset] = []  # of a direct record: see _gradient_sources

    @property
    def n_user(self) -> int:
        return len(self.outputs)

    def __call__(self, *tensors):
        if self.direct is None and "backward" in self.replays:
            self.direct = _replays_directly(self.replays["forward"], self.replays["backward"], self.outputs)
            if self.direct:
                self.gradient_sources = _gradient_sources(self.replays["backward"].gm)
        if self.direct:
            metrics.count_capture("direct")
            return tree_unflatten(list(_Direct.apply(self, *tensors)), self.out_spec)
        return self.aot(*tensors)


# ------------------------------------------------------------------ capture
_recording = threading.local()


def recording() -> bool:
    """Whether this thread is recording a captured forward (on fake tensors)."""
    return getattr(_recording, "active", False)


# Records kept per module, as Dynamo's recompile limit: past it a new key
# (a sequence length that changes every step) runs op by op, where the
# shape-generic compile path still covers it, instead of recording anew.
RECORD_LIMIT = 8
# Argument signatures (sizes) an automatic capture records per module: a
# loop's usual batch. Another size (a smaller last batch, padding to each
# batch's longest sequence) runs op by op, where a group seen at a second
# size compiles shape-generic code once that serves every later size
# (compile.shape_generic), instead of a record and a compile per size.
AUTOMATIC_SIZE_LIMIT = 1
_KEY_PARTS = ("argument structure", "argument dtypes/shapes/values", "parameters and buffers",
              "their dtypes/shapes/requires_grad", "train/eval", "grad mode", "autocast",
              "blocks checkpointed", "module attributes", "globals read")


def _key_change(key: tuple, records: dict) -> str:
    """Which parts of ``key`` differ from the last record's."""
    last = next(reversed(records))
    return ", ".join(part for part, a, b in zip(_KEY_PARTS, key, last) if a != b) or "none"


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # pytree leaves (not Tensor subclasses that may be nodes)


def _signature(leaf):
    if isinstance(leaf, torch.Tensor):
        return leaf.dtype, leaf.shape, leaf.stride(), leaf.requires_grad, leaf.device
    return type(leaf), leaf


def _class_forward(module: torch.nn.Module):
    """``module``'s forward as its class defines it, bound."""
    return type(module).forward.__get__(module)


class CapturedForward:
    """Installed as ``module.forward`` by :func:`capture` (or, ``automatic``,
    by ``Config.capture`` "auto": see steady_state): replays the record of
    the call's key, recording it first if there is none."""

    def __init__(self, module: torch.nn.Module, automatic: bool = False):
        self.module = module
        self.automatic = automatic
        self.original = module.forward
        self.state = NamedState(module)
        self.records: dict = {}
        self.refused: set = set()
        # why every call runs the forward op by op: what it wrote while recorded
        # (or, automatic, why it could not be recorded)
        self.op_by_op: str | None = None
        self.specs: dict = {}  # (number of arguments, keyword names) -> the spec of tensor-only calls

    def __call__(self, *args, **kwargs):
        module = self.module
        leaves, spec = self._flatten(args, kwargs)
        named = self.state.get()
        state = self.state.tensors
        # what a record assumes of the state besides identity (dtype, sizes,
        # requires_grad), as bytes: None when a tensor is not on the lazy device
        state_signature = _C.state_signature(state)
        if (recording() or torch.compiler.is_compiling() or state_signature is None
                or any(isinstance(x, torch.Tensor) and x.device.type != "lazy" for x in leaves)):
            return self.original(*args, **kwargs)
        if self.op_by_op is not None:
            metrics.count_capture("refused")
            return self.original(*args, **kwargs)
        if self.state.hooks:
            why = f"hooks on its submodules that a replay would not call ({', '.join(self.state.hooks[:3])})"
            metrics.count_capture("refused", type(module).__name__, why)
            return self.original(*args, **kwargs)
        key = self._key(spec, leaves, state_signature)
        if self.refused and key in self.refused:
            metrics.count_capture("refused")
            return self.original(*args, **kwargs)
        record = self.records.get(key)
        if record is None and self.automatic and self._sizes_vary(key):
            why = ("its inputs came in another size: new sizes run op by op, where a group seen at a second "
                   "size compiles shape-generic code")
            self._tell(f"{type(module).__name__}.forward: {why}")
            metrics.count_capture("refused", type(module).__name__, why)
            self.refused.add(key)
            return self.original(*args, **kwargs)
        if record is None and len(self.records) >= RECORD_LIMIT:
            why = f"more than {RECORD_LIMIT} records (a key that keeps changing: {_key_change(key, self.records)})"
            self._tell(f"{type(module).__name__}.forward has {why}; new keys run op by op")
            metrics.count_capture("refused", type(module).__name__, why)
            self.refused.add(key)
            return self.original(*args, **kwargs)
        if record is None:
            record = self._try_record(key, [name for name, _ in named], state, leaves, spec)
            if record is None:  # refused, Python state as before the record: the forward runs once, as eagerly
                return self.original(*args, **kwargs)
            metrics.count_capture("recorded")
        metrics.count_capture("replayed")
        return record(*state, *(x for x in leaves if isinstance(x, torch.Tensor)))

    def __deepcopy__(self, memo):
        """A copy of the module (an EMA model: ``copy.deepcopy(model)``) is
        captured anew: records hold this module's tensors and graphs."""
        module = copy.deepcopy(self.module, memo)  # the copy being made (memoized before its attributes)
        if not self.automatic:
            return CapturedForward(module)
        return _class_forward(module)

    def __reduce__(self):
        """Pickled (``torch.save(model)``), the module keeps its own forward."""
        return _class_forward, (self.module,)

    def _sizes_vary(self, key: tuple) -> bool:
        """Whether ``key`` would be the records' (AUTOMATIC_SIZE_LIMIT + 1)th
        argument signature, the rest of the key as a record's."""
        signatures = {k[1] for k in self.records if k[:1] + k[2:] == key[:1] + key[2:]}
        return key[1] not in signatures and len(signatures) >= AUTOMATIC_SIZE_LIMIT

    def _tell(self, message: str) -> None:
        """A refusal: a warning where the user asked for capture; where it
        is automatic, the op-by-op trace is what the user wrote, so only
        ``metrics`` (and the "capture" log topic) say so."""
        if not self.automatic:
            warnings.warn(f"lazy_mlir.capture: {message}", stacklevel=4)
        elif config.current.logs("capture"):
            print(f"lazy_mlir: automatic capture: {message}", file=sys.stderr, flush=True)

    def _key(self, spec, leaves: list, state_signature) -> tuple:
        """What a record assumes, besides tensor values (see _KEY_PARTS)."""
        module = self.module
        mode = module.mode() if isinstance(module, CapturedFunction) else module.training
        return (spec, tuple(_signature(x) for x in leaves), self.state.identity, state_signature, mode,
                torch.is_grad_enabled(), autocast.state(), _checkpointed, self.state.attributes,
                self.state.globals)

    def _try_record(self, key: tuple, names: list[str], state: list, leaves: list, spec):
        """Records ``key``, watching what the forward does to Python state;
        returns the record, or None where it was refused: a forward that
        could not be recorded (for this key), or one that wrote Python state
        (an attribute, a global, a draw from Python's random: for every key
        from now on, its Python running at every call as eagerly). Python
        state is then as before the record."""
        module = type(self.module).__name__
        python = PythonState(self.module)
        record, error = self._attempt(names, state, leaves, spec, python)
        changes = python.changes()
        if changes and error is None and not python.drew():
            # Writes of the same values at every call (NLLB's router keeps its
            # input's dtype, a warn-once flag) leave nothing for a replay to
            # miss: a second record, from the state the first left, changes
            # nothing. A counter changes again: refused.
            again = PythonState(self.module)
            record, error = self._attempt(names, state, leaves, spec, again)
            if not again.changes() and error is None:
                changes = []
            else:
                again.restore()
        if error is not None:  # Python that reads values, an op without a schema: this key runs op by op
            python.restore()
            why = (f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}, "
                   f"at {syncs.user_source_of(error.__traceback__)}")
            _release_frames(error)
            self._tell(f"{module}.forward could not be recorded, it runs op by op ({why})")
            metrics.count_capture("refused", module, why)
            self.refused.add(key)
            # what failed would fail again at the next key: a record each step,
            # for nothing (unless it failed for the blocks a budget checkpointed)
            if self.automatic and not _checkpointed:
                self.op_by_op = why
            return None
        if changes:
            python.restore()
            why = "it changes Python state that a replay would not: " + "; ".join(changes)
            self.op_by_op = why
            self._tell(f"{module}.forward runs op by op from now on ({why})")
            metrics.count_capture("refused", module, why)
            return None
        if self.state.watch(python.guards()):
            # The globals the record read join every key, with their values
            # now: earlier records and refusals did not read them, the
            # values they keep any will do.
            self.state.get()
            added = self.state.globals.values[len(key[-1].values):]
            self.records = {(*k[:-1], Values(k[-1].values + added)): r for k, r in self.records.items()}
            self.refused = {(*k[:-1], Values(k[-1].values + added)) for k in self.refused}
            key = (*key[:-1], self.state.globals)
        self.records[key] = record
        return record

    def _attempt(self, names, state, leaves, spec, python) -> tuple:
        """(the record, None) or (None, the error that stopped it)."""
        try:
            return self._record(names, state, leaves, spec, python), None
        except Exception as error:  # noqa: BLE001 - reported by _try_record
            return None, error

    def _flatten(self, args: tuple, kwargs: dict) -> tuple[list, object]:
        """``tree_flatten((args, kwargs))``. A call with tensors only (the
        usual one) has its spec kept per argument count and keyword names:
        pytree's flatten was ~1% of a small model's step."""
        values = (*args, *kwargs.values()) if kwargs else args
        if all(type(v) in _PLAIN_TENSORS for v in values):
            shape = (len(args), tuple(kwargs))
            spec = self.specs.get(shape)
            if spec is None:
                spec = self.specs[shape] = tree_flatten((args, kwargs))[1]
            return list(values), spec
        return tree_flatten((args, kwargs))

    def _record(self, names: list[str], state: list[torch.Tensor], leaves: list, spec, python: "PythonState"):
        """AOTAutograd's forward-and-backward function for this key, its
        forward recorded (its backward records at its first call), the
        recording watched by ``python``."""
        from torch._functorch._aot_autograd import graph_capture
        from torch._functorch.aot_autograd import aot_function
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.nn.utils.stateless import _reparametrize_module

        module, original = self.module, self.original
        tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        label = f"{type(module).__name__}#{len(self.records)}"
        # The record outlives this call: it keeps the call's non-tensor
        # arguments, not its tensors (a batch held would be a root of the
        # step's graph, read outside the groups: another graph, no donation).
        template = [None if isinstance(x, torch.Tensor) else x for x in leaves]

        def flat_forward(*tensors):
            full = list(template)
            for i, t in zip(tensor_at, tensors[len(state):]):
                full[i] = t
            args, kwargs = tree_unflatten(full, spec)
            swapped = dict(zip(names, tensors[:len(state)]))
            with _reparametrize_module(module, swapped, tie_weights=True), _blocks_checkpointed(module):
                result = original(*args, **kwargs)
            # a buffer the forward assigns (self.buf = t) is put back on exit,
            # the forward's value written into ``swapped``: a replay would not assign it
            python.assigned.update(name for name, t in zip(names, tensors) if swapped[name] is not t)
            record.outputs, record.out_spec = tree_flatten(result)
            return result

        record = _Record()

        def compiler(kind):
            def compile_graph(gm, example_inputs):
                if kind == "backward":
                    _check_backward_draws_nothing(gm)
                record.replays[kind] = _Replay(gm, f"{label}.{kind}")
                return record.replays[kind]
            return compile_graph

        # keep_inference_input_mutations: the inputs a forward writes are
        # copy_ nodes of its graph (see build_region), not a copy_ per input
        # traced op by op after each call (1.6 ms of a ResNet step).
        compiled = aot_function(flat_forward, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                                partition_fn=functools.partial(_partition, module=module),
                                num_params_buffers=len(state),
                                keep_inference_input_mutations=True)
        # AOTAutograd's make_fx, keeping each node's stack trace: a region's
        # ops then name the user's line, as the per-op trace does (errors,
        # warnings, dumps)
        traced_with_lines = functools.partial(make_fx, record_stack_traces=True)
        transformers_compat.register_cache_types(module)  # a DynamicCache in a forward's output
        # Fakes on the lazy device: code that makes a tensor on another's
        # device makes it there, as eagerly; regions map the device to the
        # one behind it. Tensors the forward holds outside its state (a CPU
        # constant) become constants of the graph.
        fake_mode = _LazyFakeTensorMode(allow_non_fake_inputs=True)
        fakes: dict[int, torch.Tensor] = {}  # by identity: a tensor passed twice is one input

        def fake(t):
            if id(t) not in fakes:
                with fake_mode:
                    fakes[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                fakes[id(t)].requires_grad_(t.requires_grad)
            return fakes[id(t)]

        _recording.active = True
        reentrant = []
        original_checkpoint = torch.utils.checkpoint.CheckpointFunction.forward

        def checkpoint_forward(ctx, *args):
            reentrant.append(True)
            return original_checkpoint(ctx, *args)
        try:
            # a record is a compile (AOTAutograd, functionalization): one at a
            # time with the compiles on the background thread, whose torch
            # state it would share ("Expected current_level > 0")
            with (background.compile_lock, python,
                  unittest.mock.patch.object(graph_capture, "make_fx", traced_with_lines),
                  unittest.mock.patch.object(torch.utils._traceback, "_extract_symbolized_tb", _frames_without_text),
                  unittest.mock.patch.object(torch.utils.checkpoint.CheckpointFunction, "forward",
                                             staticmethod(checkpoint_forward)),
                  unittest.mock.patch.object(torch.utils.checkpoint, "_checkpoint_without_reentrant_generator",
                                             _recomputed_in_backward(
                                                 torch.utils.checkpoint._checkpoint_without_reentrant_generator))):
                outputs = compiled(*(fake(t) for t in state), *(fake(leaves[i]) for i in tensor_at))
                _record_backward(outputs)
        finally:
            _recording.active = False
        if reentrant:
            # its recompute draws the forward's numbers again by setting the
            # generator back (draw_stream.h); recorded, the two are separate
            # draws (measured: other gradients than eager's from the first step)
            raise CaptureError("reentrant activation checkpointing (use_reentrant=True): its recompute's draws "
                               "would not be its forward's")
        record.aot = compiled
        return record


def _recomputed_in_backward(checkpoint_generator):
    """``checkpoint(use_reentrant=False)`` while a forward is recorded, its
    region's ops tagged to be recomputed in the backward, as torch.compile
    tags a checkpoint (``tag_activation_checkpoint``): recorded untagged,
    AOTAutograd's partitioner saves the region's activations and the
    backward recomputes nothing, which keeps every activation the user
    checkpointed to free (measured: a 4-layer GPT's step buffers 82 MiB
    with its blocks checkpointed and without; tagged, 43). A ``context_fn`` of the user's (selective
    checkpointing) is kept, each region a graph id of its own."""
    graph_ids = itertools.count(1)

    def generator(fn, preserve_rng_state=True, context_fn=torch.utils.checkpoint.noop_context_fn, *rest, **kwargs):
        if context_fn is torch.utils.checkpoint.noop_context_fn:
            context_fn = functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts,
                                           _prefer_recompute)

        def tagged(graph_id=next(graph_ids)):
            forward, recompute = context_fn()
            if hasattr(forward, "ac_graph_id"):  # the mode that tags the region's nodes
                forward.ac_graph_id = graph_id
            return forward, recompute
        return checkpoint_generator(fn, preserve_rng_state, tagged, *rest, **kwargs)
    return generator


# The fraction of a captured module's repeated blocks (its largest
# ModuleList of one class: a transformer's layers) recorded as checkpointed
# regions, their activations recomputed in the backward (memory_budget's
# choice; 0: none). Part of every record's key: a record at each, cached.
_checkpointed = 0.0
# With a memory budget: per captured module, what its partitions save and
# recompute (memory_budget's report and predictions); None: not measured.
_partitions: dict | None = None


def set_checkpointed(fraction: float, measure: bool = True) -> None:
    global _checkpointed, _partitions
    _checkpointed = fraction
    if measure and _partitions is None:
        _partitions = {}
    elif not measure:
        _partitions = None


def repeated_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The module's largest (by parameters) ModuleList of two or more modules of one class."""
    best, most = [], 0
    for child in module.modules():
        if isinstance(child, torch.nn.ModuleList) and len(child) > 1 and len({type(c) for c in child}) == 1:
            size = sum(p.numel() for p in child.parameters())
            if size > most:
                best, most = list(child), size
    return best


@contextlib.contextmanager
def _blocks_checkpointed(module: torch.nn.Module):
    """While a forward is recorded: the first ``_checkpointed`` of its
    repeated blocks called through ``checkpoint(use_reentrant=False)``,
    which the recording tags for recompute (``_recomputed_in_backward``)."""
    blocks = repeated_blocks(module)
    blocks = blocks[:round(_checkpointed * len(blocks))]
    own = [b.__dict__.get("forward") for b in blocks]
    for block in blocks:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    try:
        yield
    finally:
        for block, forward in zip(blocks, own):
            if forward is None:
                del block.forward
            else:
                block.forward = forward


def _partition(joint, inputs, module, **kwargs):
    """AOTAutograd's default partition (the forward saves what the backward
    reads), or where checkpointed regions are tagged, the min-cut
    partitioner, which recomputes them in the backward (torch.compile's)."""
    from torch._functorch import partitioners
    partition = (partitioners.min_cut_rematerialization_partition if partitioners.has_recomputable_ops(joint)
                 else partitioners.default_partition)
    # A draw of several results that nothing reads (an unused dropout) is
    # kept by the forward (build_region draws it), but torch 2.13's default
    # partitioner takes a result-less tuple for a tensor ("Expected
    # native_dropout to be a tensor"): an unused piece of it says what it is.
    for node in list(joint.graph.nodes):
        if _draws(node) and not node.users and isinstance(node.meta.get("val"), (tuple, list)):
            with joint.graph.inserting_after(node):
                piece = joint.graph.call_function(operator.getitem, (node, 0))
            piece.meta["val"] = node.meta["val"][0]
    forward, backward = partition(joint, inputs, **kwargs)
    if _partitions is not None:
        entry = _partitions.setdefault(f"{type(module).__name__}#{id(module):x}", {
            "module": type(module).__name__, "blocks": len(repeated_blocks(module))})
        after_tangents = _after_tangents(joint)
        entry[_checkpointed] = {"saved_bytes": _saved_bytes(forward, kwargs["num_fwd_outputs"]),
                                "recomputed_ops": _recomputed_ops(joint, after_tangents, backward),
                                "checkpointed_bytes": _checkpointed_bytes(joint, after_tangents)}
    return forward, backward


def _saved_bytes(forward: torch.fx.GraphModule, n_user: int) -> int:
    """Bytes of the activations ``forward`` saves for its backward (its
    outputs after the user's)."""
    outputs = next(n for n in reversed(forward.graph.nodes) if n.op == "output").args[0]
    return _storage_bytes(outputs[n_user:])


def _storage_bytes(nodes) -> int:
    """Bytes of the storages behind ``nodes``, each once, views of the
    graph's inputs (a transposed weight) not at all."""
    bases, total = set(), 0
    for node in nodes:
        base = node
        while (isinstance(base, torch.fx.Node) and base.op == "call_function"
               and isinstance(base.target, torch._ops.OpOverload) and base.target.is_view):
            base = base.args[0]
        if not isinstance(base, torch.fx.Node) or base.op == "placeholder" or base in bases:
            continue
        bases.add(base)
        value = base.meta.get("val")
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
    return total


def _checkpointed_bytes(joint: torch.fx.GraphModule, backward: set) -> int:
    """Bytes of the checkpointed regions' activations that the backward
    (``joint``'s nodes after the tangents) reads: what saving them (no
    checkpoint) would keep, each storage once."""
    read = [n for n in joint.graph.nodes if n.op == "call_function" and n not in backward
            and n.meta.get("recompute") is not None and any(u in backward for u in n.users)]
    return _storage_bytes(read)


def _after_tangents(joint: torch.fx.GraphModule) -> set:
    """The nodes of ``joint`` that depend on the gradients coming in: its backward."""
    after = set()
    for node in joint.graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
                a in after for a in node.all_input_nodes):
            after.add(node)
    return after


def _recomputed_ops(joint: torch.fx.GraphModule, after_tangents: set, backward: torch.fx.GraphModule) -> int:
    """The forward ops of ``joint`` (those before its tangents) that ``backward`` runs again."""
    forward = {n.name for n in joint.graph.nodes if n.op == "call_function" and n not in after_tangents}
    return sum(1 for n in backward.graph.nodes if n.op == "call_function" and n.name in forward)


def partition_stats() -> list[dict]:
    """Per captured module: its repeated blocks, and per fraction of blocks
    checkpointed the bytes saved, the ops recomputed and the bytes the
    checkpointed regions produce."""
    return [dict(entry) for entry in (_partitions or {}).values()]


def checkpointed_bytes() -> int:
    """Bytes the checkpointed regions produce with every block checkpointed,
    summed over the captured modules recorded so: at most what saving their
    activations instead would add."""
    return sum(e[1.0]["checkpointed_bytes"] for e in (_partitions or {}).values() if 1.0 in e)


def _prefer_recompute(ctx, op, *args, **kwargs):
    return torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def _release_frames(error: BaseException) -> None:
    """Drops the locals of a refused record's frames. The error's traceback
    holds them, and a frame holding the error makes a cycle that only the
    garbage collector frees: until it runs, the lazy tensors in those frames
    are live to LTC, so the step's graph makes them outputs, another graph
    than every later step's (a Switch Transformers step compiled twice)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
        error = error.__cause__ or error.__context__


class _LazyFakeTensorMode(torch._subclasses.FakeTensorMode):
    """Fakes that never become real lazy tensors. ``torch.tensor(data,
    device="lazy")`` in a forward (transformers' DynamicCache) is built on
    the CPU and moved under the mode. FakeTensorMode does that only on a
    machine without a GPU; with one, it builds the tensor on its device, or
    runs the move for real (constant propagation), and then cannot fake
    the real lazy tensor ("meta converter nyi")."""

    avoid_device_init = True


class CapturedFunction(torch.nn.Module):
    """A function of some modules' state, as a module for :func:`capture`:
    its state is theirs (registered as children, so the record keys on and
    swaps in their parameters and buffers), its forward calls the function."""

    def __init__(self, fn, modules):
        super().__init__()
        self.fn = fn
        self.used = torch.nn.ModuleList(modules)

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def mode(self) -> tuple:
        """train/eval for the record's key: the modules' own flags (the
        wrapper's is never set by the user)."""
        return tuple(m.training for m in self.used)


def capture(target, *, modules=None):
    """Records a module's forward and backward at its first call on lazy
    tensors and replays them as one IR node each from then on (see the
    module doc). Returns ``target``, its ``forward`` replaced; calls on
    other devices run the original forward.

    ``target`` may also be a function of the ``modules`` it calls (a loss:
    ``capture(lambda x, y: F.cross_entropy(model(x), y), modules=[model])``):
    then the loss and its backward are in the node too, and what is returned
    is a module to call in the function's place."""
    if isinstance(target, torch.nn.Module):
        if modules is not None:
            raise TypeError("lazy_mlir.capture: modules= is for a function; a module's state is its own")
        module = target
    else:
        if not callable(target):
            raise TypeError(f"lazy_mlir.capture takes a module or a function, not {type(target).__name__}")
        modules = [modules] if isinstance(modules, torch.nn.Module) else list(modules or [])
        if not modules or not all(isinstance(m, torch.nn.Module) for m in modules):
            raise TypeError("lazy_mlir.capture: a function needs modules=[the modules whose parameters and "
                            "buffers it reads]")
        module = CapturedFunction(target, modules)
    if not isinstance(module.forward, CapturedForward):
        module.forward = CapturedForward(module)
    return module
