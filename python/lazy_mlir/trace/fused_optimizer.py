"""Adam, AdamW and SGD steps on the lazy device traced as one node per
parameter group (``Config.fuse_optimizer``, on by default).

torch's single-tensor Adam runs ~10 ops per parameter (``mul_``, ``lerp_``,
``mul_``, ``addcmul_``, ``sqrt``, ``div``, ``add_``, ``addcdiv_`` ...), each
traced by LTC with its scalar arguments: ~10 ms of GPT-mini's trace for 52
parameters, about as much as its forward and backward together. Its fused
implementation (aten's ``_fused_adamw_``) refuses the lazy device, and the
foreach path traces per tensor anyway (LTC decomposes ``_foreach_*``). An
optimizer made with ``fused=True`` steps lazy parameters through the node
below too: torch's device check is skipped, its step counts kept on the
CPU as for ``fused=False``. SGD with momentum is 3 ops per parameter, but a CNN has
many small parameters: 1.7 ms of a zoo ResNet's 7.7 ms step.

So while such an optimizer steps (between the optimizer step pre- and
post-hooks), torch's functional ``torch.optim.adam.adam`` /
``torch.optim.sgd.sgd``, which its ``step`` calls once per parameter group,
is replaced for lazy parameters by one traced ``lazy_mlir::adam_step`` /
``lazy_mlir::sgd_step`` node: a builtin node
(``lazy_backend/nodes/builtin_op_node.h``) taking the tensor lists and returning
the new lists, written back into the parameters and state in place
(``lazy_backend/optimizer/functional_update.h``). The op is the single-tensor
algorithm (``lowering/fused_optimizer.py``): run eagerly at O0, expanded
into per-tensor aten ops by the TS -> FX conversion when compiled, which
Inductor fuses into one kernel per parameter. Adam's step counts are
advanced and its per-step scalars computed in one C++ call
(``lazy_backend/optimizer/adam_scalars.h``), in doubles as Adam does in Python; they
enter as one 3-element input per distinct step count (one for a group
whose parameters all stepped together). (Not aten's ``_fused_adamw``: it computes
them from the step count inside the op, and Inductor then recomputed the
``pow`` in every parameter's loop.) SGD's lr is one 0-d input, kept on the
device while it does not change.

What stays as the user chose: the optimizer, its state (Adam's ``step`` on
the CPU, as non-capturable Adam keeps it, SGD's momentum buffers made at its
first step, so ``state_dict`` is unchanged and the option can be switched at
any step), its hyper-parameters and the math of the single-tensor algorithm
(compiled results differ by float rounding only, as the op-by-op trace's
do). ``foreach`` is ignored (same math). Not fused, the user's path runs
unchanged and ``metrics`` counts why: ``capturable``, ``differentiable``,
complex parameters, tensor betas, sparse gradients, momentum buffers
that only some parameters have, parameters not all on one lazy device,
and optimizers excluded with ``exclude()`` (lazy_mlir.zero's). Graph
constants: betas, eps, weight decay, momentum, dampening, nesterov,
amsgrad, maximize (changing one traces a new graph); lr and the step count
are inputs (a scheduler changes lr without a recompile).

GradScaler (float16): a fused optimizer answers
``_step_supports_amp_scaling`` (as torch's ``fused=True`` ones do), so
``GradScaler.step`` hands it ``grad_scale``/``found_inf`` instead of
reading ``found_inf`` (a graph execution mid-step) to decide whether to
call ``step``. The fused node itself unscales the gradients, as
GradScaler's ``unscale_`` would (written back, so ``.grad`` reads as
eagerly; ``found_inf`` is GradScaler's own inf check's), and keeps every
tensor as it was where ``found_inf`` is set: one graph a step. Adam's step counts stay on the CPU, advanced when traced; a
skipped step's advance is taken back when ``found_inf`` has been computed,
read at the optimizer's next step (or ``state_dict()``), before its
scalars are computed: the step after a skipped one uses the count eager
Adam would. Between a skipped step's execution and then,
``state["step"]`` reads one more. Where the group is not fused (or SGD's
first momentum step, which a skip would leave without buffers), the
unscale and skip run as GradScaler's own: ``found_inf`` read, then
torch's step or none.
"""
from __future__ import annotations

import threading
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .. import config
from ..cluster import layer_groups
from ..lowering.fused_optimizer import ADAM_STEP, SGD_STEP  # importing it defines the two ops
from ..native import _C
from ..observe import metrics, syncs
from . import device_module

_active = threading.local()  # .optimizer: the Adam or SGD stepping now, if it is fused
_excluded: weakref.WeakSet = weakref.WeakSet()
_original_adam = None
_original_sgd = None
_original_adam_init_group = None
_FUSED_CLASSES = (torch.optim.Adam, torch.optim.SGD)  # AdamW is an Adam
_hooks: list = []
# optimizer -> [(found_inf, [Adam step counts it advanced])]: skips to take back (_settle)
_unsettled_skips: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_settle_hooked: weakref.WeakSet = weakref.WeakSet()


def exclude(optimizer: torch.optim.Optimizer) -> None:
    """Never fuse ``optimizer``'s steps (lazy_mlir.zero's inner optimizer:
    its per-tensor updates run faster there, see zero/__init__.py)."""
    _excluded.add(optimizer)


def install() -> None:
    """Wraps ``torch.optim.adam.adam`` (Adam's and AdamW's ``step`` call it)
    and ``torch.optim.sgd.sgd``, and installs the step hooks that say which
    optimizer is stepping. Once per process; the config is read at each step."""
    global _original_adam, _original_sgd, _original_adam_init_group
    if _original_adam is not None:
        return
    import torch.optim.adam as adam_module
    import torch.optim.sgd as sgd_module

    _original_adam, _original_sgd = adam_module.adam, sgd_module.sgd
    adam_module.adam, sgd_module.sgd = _adam, _sgd
    _original_adam_init_group = torch.optim.Adam._init_group
    torch.optim.Adam._init_group = _adam_init_group
    _hooks.append(register_optimizer_step_pre_hook(_before_step))
    _hooks.append(register_optimizer_step_post_hook(_after_step))
    for cls in _FUSED_CLASSES:
        cls._step_supports_amp_scaling = _AmpScalingAnswer()


def _fuses(optimizer) -> bool:
    return (config.current.fuse_optimizer and isinstance(optimizer, _FUSED_CLASSES) and optimizer not in _excluded
            and not torch.compiler.is_compiling())  # torch.compile(opt.step) in the same process: not ours


class _AmpScalingAnswer:
    """``optimizer._step_supports_amp_scaling``, which GradScaler.step reads:
    what the optimizer set itself (``fused=True`` sets True), else True for
    a fused optimizer with lazy parameters (see the module's docstring)."""

    def __get__(self, optimizer, owner=None):
        if optimizer is None:
            return self
        return optimizer.__dict__.get("_step_supports_amp_scaling", False) or _claims_amp_scaling(optimizer)

    def __set__(self, optimizer, value) -> None:
        optimizer.__dict__["_step_supports_amp_scaling"] = value


def _claims_amp_scaling(optimizer) -> bool:
    return _fuses(optimizer) and any(p.device.type == "lazy" for group in optimizer.param_groups
                                     for p in group["params"])


def _before_step(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():
        return
    fuse = _fuses(optimizer)
    _active.optimizer = optimizer if fuse else None
    # grad_scale/found_inf in this step are ours to handle (a fused=True
    # optimizer's own only where its parameters are not lazy)
    _active.amp_claimed = _claims_amp_scaling(optimizer)
    if _active.amp_claimed and optimizer.defaults.get("fused"):
        optimizer._need_device_dtype_check_for_fused = False  # SGD(fused=True)'s, which refuses the lazy device
    _settle(optimizer)


def _after_step(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():
        return
    _active.optimizer = None
    _active.amp_claimed = False


def _amp_claimed(grad_scale, found_inf) -> bool:
    """Whether GradScaler passed this step's grad_scale/found_inf because
    this module claimed ``_step_supports_amp_scaling``."""
    return (grad_scale is not None or found_inf is not None) and getattr(_active, "amp_claimed", False)


def _unscale(grads, grad_scale) -> None:
    """For a group that is not fused, GradScaler.unscale_'s arithmetic,
    traced (one node): each gradient times ``1 / grad_scale`` (computed as
    GradScaler computes it), in place; the inf check's own result is not
    needed (GradScaler's ``found_inf``): the compiled graph drops it."""
    inv_scale = grad_scale.double().reciprocal().float()
    scratch = torch.zeros((), dtype=torch.float32, device=inv_scale.device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, scratch, inv_scale)


def _step_taken_eagerly(grads, grad_scale, found_inf) -> bool:
    """For a group that is not fused: what GradScaler does for an optimizer
    without ``_step_supports_amp_scaling``, gradients unscaled and
    ``found_inf`` read (a graph execution); whether to step."""
    if grad_scale is not None and grads:
        _unscale(grads, grad_scale.to(grads[0].device))
    if found_inf is None:
        return True
    with syncs.planned_read("GradScaler's found_inf (an optimizer group that is not fused)"):
        return found_inf.item() == 0


def _defer_skip(found_inf, state_steps) -> None:
    """Adam's step counts were advanced for a step that ``found_inf`` may
    skip: taken back by ``_settle`` once it is known."""
    optimizer = _active.optimizer
    pending = _unsettled_skips.setdefault(optimizer, [])
    if pending and pending[-1][0] is found_inf:  # another group or layer of the same step
        pending[-1][1].extend(state_steps)
    else:
        pending.append((found_inf, list(state_steps)))
    if optimizer not in _settle_hooked:
        _settle_hooked.add(optimizer)
        optimizer.register_state_dict_pre_hook(_settle)
        optimizer.register_load_state_dict_pre_hook(_forget_skips)


def _forget_skips(optimizer, state_dict) -> None:
    """Before ``load_state_dict``: its step counts replace those to take back
    (returns None: a hook's result would replace the state dict)."""
    _unsettled_skips.pop(optimizer, None)


def _settle(optimizer) -> None:
    """Takes back the step-count advance of each skipped step of
    ``optimizer`` (``found_inf`` read: computed by an earlier execution, no
    new one unless its step was not marked yet)."""
    for found_inf, state_steps in _unsettled_skips.pop(optimizer, ()):
        with syncs.planned_read("GradScaler's found_inf of an earlier step (Adam's step count)"):
            skipped = found_inf.item() != 0
        if skipped:
            for step in state_steps:
                step.sub_(1)


def _adam_init_group(self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps):
    """Adam._init_group (AdamW's too). While a fused optimizer steps, a group
    whose states all exist (any step but the first) has its lists collected
    in one C++ call (optimizer_checks.h): torch's loop was ~1.4 us a
    parameter. Otherwise, and where torch's would raise, torch's own runs."""
    if (getattr(_active, "optimizer", None) is self and not group["differentiable"]
            and not (group["foreach"] and torch.is_tensor(group["lr"]))):
        if group["fused"]:
            _steps_to_the_host(self, group["params"])
        has_complex = _C.collect_adam_group(group["params"], self.state, group["amsgrad"], params_with_grad, grads,
                                            exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        if has_complex is not None:
            return has_complex
        if group["fused"] and _fusing(group["params"]):
            # fused=True served by the node: torch's init as for fused=False
            # (its device check refuses the lazy device; step counts on the CPU)
            group = {**group, "fused": False}
    return _original_adam_init_group(self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                     state_steps)


def _steps_to_the_host(optimizer, params) -> None:
    """A fused=True optimizer's loaded state (load_state_dict) has its step
    counts on the parameters' device, as torch's fused kernels read them:
    the node's are on the CPU (ours, as for fused=False). A load moves a
    group's counts together: its first parameter's tells (one look a step)."""
    first = optimizer.state.get(params[0]) if params else None
    if not (first and torch.is_tensor(first.get("step")) and first["step"].device.type == "lazy"):
        return
    for p in params:
        state = optimizer.state.get(p)
        if state and torch.is_tensor(state.get("step")) and state["step"].device.type == "lazy":
            state["step"] = state["step"].cpu()


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, foreach=None, capturable=False,
          differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False,
          decoupled_weight_decay=False, *, amsgrad, beta1, beta2, lr, weight_decay, eps, maximize):
    """torch.optim.adam.adam, traced as one node when the stepping optimizer is fused."""
    amp = _amp_claimed(grad_scale, found_inf)
    if _fusing(params):
        why = _unfusable(params, state_steps, capturable, differentiable, amp, grad_scale, found_inf, beta1,
                         beta2, lr)
        if why is None:
            lists = params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], state_steps
            for chunk in _by_layer(params, lists):
                _fused_adam_step(*chunk, amsgrad=amsgrad, beta1=beta1, beta2=beta2, lr=lr,
                                 weight_decay=weight_decay, eps=eps, maximize=maximize,
                                 decoupled=decoupled_weight_decay, found_inf=found_inf if amp else None,
                                 grad_scale=grad_scale if amp else None)
            metrics.count_optimizer_group(None)
            return
        metrics.count_optimizer_group(why)
    if amp:
        if not _step_taken_eagerly(grads, grad_scale, found_inf):
            return
        grad_scale = found_inf = None
    _original_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, foreach=foreach,
                   capturable=capturable, differentiable=differentiable, fused=fused, grad_scale=grad_scale,
                   found_inf=found_inf, has_complex=has_complex, decoupled_weight_decay=decoupled_weight_decay,
                   amsgrad=amsgrad, beta1=beta1, beta2=beta2, lr=lr, weight_decay=weight_decay, eps=eps,
                   maximize=maximize)


def _by_layer(params, lists, with_indices=False):
    """``lists`` (each indexed like ``params``, or empty) cut into one piece
    per marked layer (lazy_mlir.cluster.layer_groups), a boundary marked before
    each: a layer's update is then a group of its own, the same code for
    every layer, and a layer skipped by LayerDrop (no gradient, so not in
    ``params``) changes no other layer's group. One piece when no
    parameter is in a marked layer."""
    pieces = layer_groups.pieces(params)
    if len(pieces) == 1:
        yield (pieces[0], lists) if with_indices else lists
        return
    for indices in pieces:
        _C.mark_layer_boundary()
        chunk = tuple([values[i] for i in indices] if values else values for values in lists)
        yield (indices, chunk) if with_indices else chunk


def _fusing(params) -> bool:
    """Whether the optimizer stepping now is fused and steps lazy parameters
    (not while Dynamo traces torch's own step: torch.compile(opt.step) in
    the same process)."""
    return (not torch.compiler.is_compiling() and getattr(_active, "optimizer", None) is not None
            and any(p.device.type == "lazy" for p in params))


def _sgd(params, d_p_list, momentum_buffer_list, has_sparse_grad=False, foreach=None, fused=None, grad_scale=None,
         found_inf=None, *, weight_decay, momentum, lr, dampening, nesterov, maximize):
    """torch.optim.sgd.sgd, traced as one node when the stepping optimizer is fused."""
    amp = _amp_claimed(grad_scale, found_inf)
    if _fusing(params):
        why = _sgd_unfusable(params, momentum_buffer_list, has_sparse_grad, amp, grad_scale, found_inf,
                             momentum, lr, weight_decay)
        if why is None:
            for indices, chunk in _by_layer(params, (params, d_p_list, momentum_buffer_list), with_indices=True):
                _fused_sgd_step(*chunk, weight_decay=float(weight_decay), momentum=float(momentum), lr=lr,
                                dampening=float(dampening), nesterov=bool(nesterov), maximize=bool(maximize),
                                found_inf=found_inf if amp else None, grad_scale=grad_scale if amp else None)
                for i, buffer in zip(indices, chunk[2]):  # its first step makes the buffers
                    momentum_buffer_list[i] = buffer
            metrics.count_optimizer_group(None)
            return
        metrics.count_optimizer_group(why)
    if amp:
        if not _step_taken_eagerly(d_p_list, grad_scale, found_inf):
            return
        grad_scale = found_inf = None
    _original_sgd(params, d_p_list, momentum_buffer_list, has_sparse_grad=has_sparse_grad, foreach=foreach,
                  fused=fused, grad_scale=grad_scale, found_inf=found_inf, weight_decay=weight_decay,
                  momentum=momentum, lr=lr, dampening=dampening, nesterov=nesterov, maximize=maximize)


def _unfusable_group(params, amp, grad_scale, found_inf, lr, state_steps=()) -> str | None:
    """Why a parameter group of any fused optimizer keeps torch's own path
    (None: nothing here stops it; ``fused=True`` does not: the node is what
    aten's fused kernel computes, up to rounding). The per-tensor checks (complex or
    non-float parameters, not all on one lazy device, Adam's step counts
    not on the CPU) are one C++ call: lazy_backend/optimizer/optimizer_checks.h."""
    if not amp and (grad_scale is not None or found_inf is not None):
        return "grad_scale/found_inf set on the optimizer by hand"
    if isinstance(lr, torch.Tensor) and (lr.numel() != 1 or lr.requires_grad or lr.device.type != "cpu"):
        return "lr tensor that is not a plain CPU value"
    return _C.group_tensors_unfusable(params, list(state_steps))


def _sgd_unfusable(params, momentum_buffer_list, has_sparse_grad, amp, grad_scale, found_inf, momentum, lr,
                   weight_decay) -> str | None:
    """Why this SGD parameter group keeps torch's own path (None: it is fused)."""
    if has_sparse_grad:
        return "sparse gradients"
    if isinstance(weight_decay, torch.Tensor):
        return "tensor weight_decay"
    if momentum != 0 and len({b is None for b in momentum_buffer_list}) > 1:
        return "momentum buffers that only some parameters have"
    if amp and found_inf is not None and momentum != 0 and momentum_buffer_list and momentum_buffer_list[0] is None:
        return "GradScaler on the first momentum step (a skip leaves no buffers)"
    return _unfusable_group(params, amp, grad_scale, found_inf, lr)


_lr_on_device: dict = {}  # (lr, device, backing) -> its 0-d float64 lazy tensor: no transfer per step while lr holds


def _lr_tensor(lr: float, device: torch.device) -> torch.Tensor:
    key = (lr, device, device_module.backing_device())
    if key not in _lr_on_device:
        if len(_lr_on_device) > 64:  # a scheduler's values: keep the recent ones only
            _lr_on_device.clear()
        # pending device data until the step's sync gives it its data
        # (lazy_backend/ltc_fixes/pending_data.h): no root of the first step's graph
        _lr_on_device[key] = torch.tensor(lr, dtype=torch.float64).to(device)
    return _lr_on_device[key]


def _fused_sgd_step(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
                    maximize, found_inf, grad_scale) -> None:
    device = params[0].device
    lr = lr.item() if isinstance(lr, torch.Tensor) else float(lr)
    first = momentum != 0 and momentum_buffer_list[0] is None  # torch's SGD makes each buffer from the gradient
    buffers = [] if momentum == 0 or first else list(momentum_buffer_list)
    arguments = [params, grads, buffers, _lr_tensor(lr, device), weight_decay, momentum, dampening,
                 nesterov, maximize, found_inf, grad_scale]
    if first:  # new state tensors for the results to go into, as the optimizer's own
        for i, p in enumerate(params):
            momentum_buffer_list[i] = torch.empty_like(p)
    _trace_update(SGD_STEP, arguments, [params, momentum_buffer_list if momentum != 0 else [],
                                        _unscaled_in_place(grads, grad_scale)])


def _unfusable(params, state_steps, capturable, differentiable, amp, grad_scale, found_inf, beta1, beta2,
               lr) -> str | None:
    """Why this Adam parameter group keeps torch's own path (None: it is fused)."""
    if capturable:
        return "capturable=True"
    if differentiable:
        return "differentiable=True"
    if isinstance(beta1, torch.Tensor) or isinstance(beta2, torch.Tensor):
        return "tensor betas"
    return _unfusable_group(params, amp, grad_scale, found_inf, lr, state_steps)


def _fused_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, amsgrad, beta1, beta2, lr,
                     weight_decay, eps, maximize, decoupled, found_inf, grad_scale) -> None:
    lr = lr.item() if isinstance(lr, torch.Tensor) else lr
    beta1, beta2, weight_decay, eps = float(beta1), float(beta2), float(weight_decay), float(eps)
    # Adam's ``step_t += 1`` and its per-step scalars, one input per distinct
    # step count: an input, so a new step or learning rate needs no new graph
    scalars, scalar_rows = _C.advance_adam_steps(state_steps, float(lr), weight_decay, beta1, beta2,
                                                 params[0].device)
    if found_inf is not None:
        _defer_skip(found_inf, state_steps)

    # the tensors as they are: the node reads their current values (builtin_op_node.h)
    arguments = [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, scalars, scalar_rows, beta1, beta2,
                 weight_decay, eps, bool(amsgrad), bool(maximize), bool(decoupled), found_inf, grad_scale]
    _trace_update(ADAM_STEP, arguments, [params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                         _unscaled_in_place(grads, grad_scale)])


def _unscaled_in_place(grads, grad_scale) -> list:
    """The gradients the node writes: unscaled by it with GradScaler's
    ``grad_scale`` (``.grad`` then reads as after GradScaler's own unscale,
    as after torch's fused kernels); else none (torch's Adam and SGD leave
    them as they are)."""
    return grads if grad_scale is not None else []


def _trace_update(op: str, arguments: list, updated: list[list[torch.Tensor]]) -> None:
    """Traces ``op`` as one node and writes its Tensor[] results into the
    tensors of ``updated`` (one list per result) in place."""
    _C.trace_update(op, "default", arguments, [t for ts in updated for t in ts], [len(ts) for ts in updated])
