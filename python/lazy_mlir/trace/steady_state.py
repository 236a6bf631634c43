"""Make the first training step trace the graph of every later step, so a
step compiles once instead of twice.

LTC traces the first step differently from the next for two reasons:
1. A parameter just moved to the lazy device is an alias (``nn.Parameter``
   detaches) of the moved tensor, read through a pending ``detach_copy``;
   once a step has updated it in place and synced, LTC reads it as the
   functionalized alias of device data, through other nodes.
2. The optimizer creates its state (``zeros_like(p)``) inside the first
   step's graph; later steps read that state as device data.
So before a model's first training forward its parameters are updated in
place once (``mul_(1)``, exact) and synced by setup graphs of at most
``SETTLE_BYTES`` of parameters each (below), run in TorchScript (nothing to
compile) and left out of the metrics' step figures (``setup_graphs``); and
an optimizer's first step creates zero-filled state as device data.
``Config.auto_prepare`` (on by default) does both through global module and
optimizer hooks; ``prepare(model, optimizer)`` does it explicitly. A
settled parameter that is the only alias of its storage then becomes a
functional base of its own (``_C.own_buffers``): its updates no longer go
through the moved tensor and a regenerated view. With ``Config.capture``
"auto" (the default), the module settled at its first training call (the
model: the first module a step calls with trainable lazy parameters; its
submodules are settled with it) is captured too, before that call reads its
``forward``: the first step replays as every later one (see capture). The
first call is seen by wrapping ``nn.Module.__call__`` (a forward pre-hook
runs after the call has read ``forward``); the wrapper costs a Python frame
per module call (~1 us), so it is in place only while a trainable parameter
created on the lazy device (by ``.to("lazy")`` or built there) is not yet
settled.
SGD's first step is other math: its momentum buffer starts as a copy of
the gradient, later ones are ``buf * momentum + grad * (1 - dampening)``.
Without dampening (the default) a zero buffer gives the gradient's value
(a -0.0 entry becomes +0.0), so the first step is given zero buffers as
device data and runs the steady-state update. With dampening it still
traces a second graph after the first step.
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .. import config
from ..cluster import compilable, layer_groups
from ..native import _C
from ..observe import metrics, syncs
from . import capture, device_module

_settled: weakref.WeakSet = weakref.WeakSet()       # modules decided on (their parameters settled, or none to settle)
_state_as_data: weakref.WeakSet = weakref.WeakSet()  # optimizers enrolled by prepare()
_first_steps: dict = {}  # optimizer -> its _StateAsDeviceData mode, during its first step
_hooks: list = []
# Trainable lazy parameters not yet settled, by id (a WeakSet compares
# tensors with ==, elementwise).
_unsettled: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_original_parameter_new = torch.nn.Parameter.__new__
_original_module_call = torch.nn.Module.__call__


def prepare(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Call once after moving ``model`` to the lazy device (and creating its
    optimizer), before the first step: what ``auto_prepare`` does by itself
    at the first forward and the first optimizer step. Runs one small setup
    graph."""
    params = _lazy_params(model)
    if not params:
        raise ValueError("lazy_mlir.prepare: the model has no parameter on the lazy device; "
                         "call it after model.to('lazy')")
    _settle(model, params)
    _capture_automatically(model)
    if optimizer is not None:
        _state_as_data.add(optimizer)


def install() -> None:
    """The global hooks behind ``auto_prepare`` (once per process; they read
    the config at each call)."""
    if not _hooks:
        _arm()  # parameters moved before init() are not seen: the first settle decides
        _hooks.append(register_optimizer_step_pre_hook(_before_step))
        _hooks.append(register_optimizer_step_post_hook(_after_step))
        torch.nn.Parameter.__new__ = staticmethod(_new_parameter)


def _new_parameter(cls, data=None, requires_grad=True):
    param = _original_parameter_new(cls, data, requires_grad)
    if requires_grad and param.device.type == "lazy":
        _unsettled[id(param)] = param
        _arm()
    return param


def _arm() -> None:
    torch.nn.Module.__call__ = _call_while_unsettled


def _call_while_unsettled(self, *args, **kwargs):
    """``nn.Module.__call__`` while a trainable lazy parameter is unsettled.
    Dynamo tracing a torch.compile'd module in the same process skips it."""
    if not torch.compiler.is_compiling() and self not in _settled:
        _before_forward(self)
    return _original_module_call(self, *args, **kwargs)


def _decided(module: torch.nn.Module) -> None:
    """``module`` and its submodules need no settling any more; the wrapper
    goes once no trainable lazy parameter is left unsettled."""
    _settled.update(module.modules())
    for p in module.parameters():
        _unsettled.pop(id(p), None)
    if not _unsettled:
        torch.nn.Module.__call__ = _original_module_call


def _lazy_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.device.type == "lazy"]


def _settle(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
    """Updates ``params`` in place once and syncs them with the tensors under
    their functionalization aliases, and nothing else: a mark_step here would
    also materialise the user's inputs already moved to the device, and the
    first step would then read them unlike every later step. Then each
    parameter reads its alias's buffer, as after a step (where one output
    feeds both): the first step's group inputs then alias alike."""
    _decided(model)
    layer_groups.attach(model)
    chunks = _by_bytes(params, SETTLE_BYTES)
    for i, chunk in enumerate(chunks):
        with torch.no_grad():
            for p in chunk:
                p.mul_(True if p.dtype == torch.bool else 1)  # a bool one (a frozen mask) stays bool
        _setup_sync(chunk + _C.functional_bases(chunk) + (_lazy_buffers(model) if i == len(chunks) - 1 else []))
    _C.share_base_buffers(params)
    _C.own_buffers(params)


# A setup graph settles parameters of at most these bytes: it writes each
# into a new buffer while the moved tensor's two copies (LTC's host copy and
# its device data) are alive. One graph for the whole model held it three
# times at once: at GPT-2-small's shape the run's peak, 2.2 GB against the
# steady step's 1.96. Chunk by chunk, each frees what the next reuses.
SETTLE_BYTES = 64 << 20


def _by_bytes(params: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``params`` in order, in runs of at most ``limit`` bytes (a larger one alone)."""
    chunks, size = [[]], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if chunks[-1] and size + nbytes > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += nbytes
    return chunks


def _lazy_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """Buffers moved like the parameters (pending device data until a sync
    reads them: a root of the first step's graph only), and those built on
    the device with the bases of their views (GPT's causal mask of a tril,
    whose pending IR would go into the first step and not the second)."""
    buffers = [b for b in model.buffers() if b.device.type == "lazy"]
    return buffers + _C.functional_bases(buffers)


def _setup_sync(tensors: list[torch.Tensor]) -> None:
    """Syncs ``tensors`` as a setup graph: run in TorchScript (nothing
    compiles while ``compilable.settling``), left out of the step figures."""
    if not tensors:
        return
    with compilable.settling(), metrics.setup_graph():
        _sync_settled(tensors)


def _sync_settled(tensors: list[torch.Tensor]) -> None:
    torch._C._lazy._sync_multi(tensors, [], True, True)


syncs.count_as_step(_sync_settled)  # a setup graph, not a value read


def _before_forward(module: torch.nn.Module) -> None:
    """A module's first call in training: settle its parameters (each module
    is decided on once; its submodules with it) and capture it."""
    if not config.current.auto_prepare or not torch.is_grad_enabled():
        return
    if getattr(module, "_lazy_mlir_zero", None) is not None:  # ZeRO manages these parameters
        _decided(module)
        _setup_sync(_lazy_buffers(module))  # as _settle syncs a model's
        _capture_automatically(module)
        return
    params = _lazy_params(module)
    if any(p.requires_grad for p in params):
        # frozen ones too, as prepare() does: a frozen weight left pending is
        # a detach copy at the first step and device data at the next (its
        # sync settles it), another graph, compiled again (HF Pegasus' and
        # Whisper's sinusoidal positions)
        _settle(module, params)
        _capture_automatically(module)
    else:
        _settled.add(module)


def _capture_automatically(module: torch.nn.Module) -> None:
    """``capture(module)`` where ``Config.capture`` is "auto", unless the
    user captured it (or a function of it) already."""
    if config.current.capture == "auto" and not isinstance(module.forward, capture.CapturedForward):
        module.forward = capture.CapturedForward(module, automatic=True)


def _before_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling() or optimizer.state or optimizer in _first_steps:
        return
    enrolled = optimizer in _state_as_data or (config.current.auto_prepare and any(
        p.device.type == "lazy" for group in optimizer.param_groups for p in group["params"]))
    if enrolled:
        if isinstance(optimizer, torch.optim.SGD):
            _zero_momentum_buffers(optimizer)
        mode = _StateAsDeviceData()
        mode.__enter__()
        _first_steps[optimizer] = mode


def _zero_momentum_buffers(optimizer: torch.optim.SGD) -> None:
    """Zero momentum buffers, as device data, for the lazy parameters that
    have a gradient (those SGD's first step gives a buffer), where a zero
    buffer updates to the gradient: momentum without dampening."""
    for group in optimizer.param_groups:
        if group.get("momentum", 0) == 0 or group.get("dampening", 0) != 0:
            continue
        for p in group["params"]:
            if p.device.type == "lazy" and p.grad is not None and not p.grad.is_sparse:
                zeros = torch.zeros(p.grad.shape, dtype=p.grad.dtype)
                optimizer.state[p]["momentum_buffer"] = zeros.to(p.device)


def _after_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    # A step that raised skips this hook: its mode stays pushed, and only
    # makes zeros_like/ones_like/full_like of lazy tensors device data.
    if torch.compiler.is_compiling():
        return
    mode = _first_steps.pop(optimizer, None)
    if mode is not None:
        mode.__exit__(None, None, None)


def _fill_value(func, args, kwargs):
    if func is torch.zeros_like:
        return 0
    if func is torch.ones_like:
        return 1
    return args[1] if len(args) > 1 else kwargs["fill_value"]  # full_like


class _StateAsDeviceData(torch.overrides.TorchFunctionMode):
    """Tensors that an optimizer creates like a lazy parameter (zeros_like,
    ones_like, full_like) are made on the CPU and moved, device data as its
    state is in every later step, instead of a constant in the graph (the
    step's sync gives them their data: lazy_backend/ltc_fixes/pending_data.h)."""

    _CREATORS = (torch.zeros_like, torch.ones_like, torch.full_like)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._CREATORS:
            like = args[0]
            device = torch.device(kwargs.get("device") or like.device)
            if device.type == "lazy":
                value = torch.full(like.shape, _fill_value(func, args, kwargs), dtype=kwargs.get("dtype") or like.dtype,
                                   device=device_module.backing_device())
                # its buffer is the device data (.to would copy it twice: AdamW's moments thrice for a moment)
                return _C.adopt_as_device_data(value).requires_grad_(bool(kwargs.get("requires_grad", False)))
        return func(*args, **kwargs)
