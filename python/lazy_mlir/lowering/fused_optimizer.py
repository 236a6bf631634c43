"""``lazy_mlir::adam_step`` and ``lazy_mlir::sgd_step`` (one traced node for
an Adam/AdamW or SGD step over a parameter group, see
``lazy_mlir.trace.fused_optimizer``) -> per-tensor aten ops.

The node takes and returns tensor lists, which our MLIR passes (they
reason per tensor value: in-place writes, ZeRO shards) and the export back
to FX do not model. So the TS -> FX conversion expands it here into the ops
torch's single-tensor Adam runs (``_single_tensor_adam``, not capturable),
which Inductor fuses into one kernel per parameter, as it does the unfused
trace. ``adam_update`` is also the op's eager kernel (O0, TorchScript): one
definition of the math.

Adam computes its per-step scalars in Python doubles; so does
``lazy_mlir.trace.fused_optimizer`` (in C++, ``lazy_backend/optimizer/adam_scalars.h``):
for each distinct step count of the group one float64 tensor
``[1 - lr * weight_decay, bias_correction2 ** 0.5, -lr / bias_correction1]``,
and ``scalar_rows[i]`` names parameter ``i``'s; read here and cast to the
parameter's dtype where Adam passes a Python scalar. (Computed in the graph
from the step count instead, as aten's ``_fused_adamw`` does, Inductor
inlined the ``pow`` into every parameter's loop.)

All parameters of a step count read the same tensor. Inductor fuses two
kernels neither of which depends on the other ("horizontal") when they read
at least ``score_fusion_memory_threshold`` bytes in common (10 by default):
the 24 bytes every update reads would merge updates of different layers
into later kernels of the backward, away from the matrix product that had
just computed each gradient (then in cache), and GPT-mini's generated code
ran slower than the op-by-op trace's. ``codegen.inductor`` raises the
threshold above those 24 bytes (``FUSION_MEMORY_THRESHOLD``), so that the
updates are scheduled as the op-by-op trace's are. (One input per parameter,
as this was before, did the same at ~5 us and one graph input per parameter
and step.)
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

aten = torch.ops.aten

ADAM_STEP = "lazy_mlir::adam_step"
ADAM_STEP_SCHEMA = (
    "adam_step(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
    "Tensor[] max_exp_avg_sqs, Tensor[] step_scalars, int[] scalar_rows, float beta1, float beta2, float weight_decay, float eps, "
    "bool amsgrad, bool maximize, bool decoupled_weight_decay, Tensor? found_inf=None, Tensor? grad_scale=None) "
    "-> (Tensor[], Tensor[], Tensor[], Tensor[], Tensor[])")
DECAY, BIAS_CORRECTION2_SQRT, NEG_STEP_SIZE = range(3)  # a step_scalars tensor's entries (adam_scalars.h)


def adam_update(emit: Callable, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, scalars, scalar_rows, beta1,
                beta2, weight_decay, eps, amsgrad, maximize, decoupled_weight_decay, found_inf=None, grad_scale=None,
                *, dtype_of: Callable, place: Callable = lambda what: contextlib.nullcontext()):
    """The op's results (params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs after
    the step, the unscaled grads). ``emit(target, *args, **kwargs)`` runs or
    records one aten call; ``dtype_of`` gives a value's dtype; ``place(i)``
    (a context) is where parameter ``i``'s update is recorded. ``found_inf``
    (GradScaler's, 0-d, non-zero when a gradient overflowed) keeps every
    tensor as it was; ``grad_scale`` (GradScaler's scale) unscales the
    gradients first (see ``_unscaled``)."""

    def scalar(i, which):  # Adam's Python scalar, as the parameter's (op math) dtype
        dtype = dtype_of(params[i])
        return emit(aten._to_copy.default, emit(aten.select.int, scalars[scalar_rows[i]], 0, which),
                    dtype=torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)

    new_params, new_exp_avgs, new_exp_avg_sqs, new_max, unscaled = [], [], [], [], []
    for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        with place(i):
            if grad_scale is not None:
                grad = _unscaled(emit, grad, grad_scale, dtype_of(grad))
                unscaled.append(grad)
            _update_one(emit, i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sqs, scalar, beta1, beta2,
                        weight_decay, eps, amsgrad, maximize, decoupled_weight_decay,
                        new_params, new_exp_avgs, new_exp_avg_sqs, new_max)
            if found_inf is not None:
                kept = _keeper(emit, found_inf)
                for olds, news in ((params, new_params), (exp_avgs, new_exp_avgs), (exp_avg_sqs, new_exp_avg_sqs),
                                   (max_exp_avg_sqs, new_max)):
                    if news:
                        news[i] = kept(olds[i], news[i])
    return new_params, new_exp_avgs, new_exp_avg_sqs, new_max, unscaled


def _unscaled(emit: Callable, grad, grad_scale, dtype):
    """GradScaler.unscale_'s arithmetic on one gradient, its inv_scale
    computed as GradScaler computes it (a float64 reciprocal, then
    float32); not kept back where ``found_inf`` is set, as GradScaler's
    unscale is not. In the node, not traced before it: a traced unscale
    call and four scalar ops a step fewer (GradScaler's own inf check has
    computed ``found_inf``). The inv_scale is recomputed per parameter
    (three 0-d ops each): one value shared by updates that ``place`` puts
    anywhere in the backward would have to come before all of them."""
    inv_scale = emit(aten._to_copy.default,
                     emit(aten.reciprocal.default, emit(aten._to_copy.default, grad_scale, dtype=torch.float64)),
                     dtype=torch.float32)
    return times_inv_scale(emit, grad, inv_scale, dtype)


def times_inv_scale(emit: Callable, grad, inv_scale, dtype):
    """``grad * inv_scale`` as aten's ``_amp_foreach_non_finite_check_and_unscale_``
    computes it: in float32 (float64 for float64) and back to ``dtype``."""
    opmath = torch.float64 if dtype == torch.float64 else torch.float32
    return emit(aten._to_copy.default, emit(aten.mul.Tensor, emit(aten._to_copy.default, grad, dtype=opmath),
                                            inv_scale), dtype=dtype)


def _keeper(emit: Callable, found_inf):
    """``kept(old, new)``: ``old`` where ``found_inf`` is set (GradScaler
    skips the step), else ``new``: what torch's fused Adam/SGD kernels do
    with AMP's found_inf, and what GradScaler's skipped ``optimizer.step()``
    leaves. Selected, not computed with ``found_inf`` as a factor: an
    overflowed step's values are inf or nan."""
    skip = emit(aten.ne.Scalar, found_inf, 0)
    return lambda old, new: emit(aten.where.self, skip, old, new)


def _update_one(emit, i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sqs, scalar, beta1, beta2, weight_decay, eps,
            amsgrad, maximize, decoupled_weight_decay, new_params, new_exp_avgs, new_exp_avg_sqs, new_max):
    if maximize:
        grad = emit(aten.neg.default, grad)
    if weight_decay != 0:
        if decoupled_weight_decay:
            param = emit(aten.mul.Tensor, param, scalar(i, DECAY))
        else:
            grad = emit(aten.add.Tensor, grad, param, alpha=weight_decay)
    exp_avg = emit(aten.lerp.Scalar, exp_avg, grad, 1 - beta1)
    exp_avg_sq = emit(aten.addcmul.default, emit(aten.mul.Tensor, exp_avg_sq, beta2), grad, grad,
                      value=1 - beta2)
    second = exp_avg_sq
    if amsgrad:
        second = emit(aten.maximum.default, max_exp_avg_sqs[i], exp_avg_sq)
        new_max.append(second)
    denom = emit(aten.add.Tensor, emit(aten.div.Tensor, emit(aten.sqrt.default, second),
                                       scalar(i, BIAS_CORRECTION2_SQRT)), eps)
    # addcdiv(param, exp_avg, denom, value=-step_size): param + (value * exp_avg) / denom
    update = emit(aten.div.Tensor, emit(aten.mul.Tensor, exp_avg, scalar(i, NEG_STEP_SIZE)), denom)
    new_params.append(emit(aten.add.Tensor, param, update))
    new_exp_avgs.append(exp_avg)
    new_exp_avg_sqs.append(exp_avg_sq)


# SGD (torch.optim.SGD's single-tensor algorithm). Its one per-step scalar,
# lr, is one 0-d float64 input shared by the group's parameters: 8 bytes
# read in common, under Inductor's horizontal-fusion threshold (see above),
# as the op-by-op trace's lr is.
SGD_STEP = "lazy_mlir::sgd_step"
SGD_STEP_SCHEMA = (
    "sgd_step(Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, Tensor lr, float weight_decay, "
    "float momentum, float dampening, bool nesterov, bool maximize, Tensor? found_inf=None, Tensor? grad_scale=None) "
    "-> (Tensor[], Tensor[], Tensor[])")


def sgd_update(emit: Callable, params, grads, momentum_buffers, lr, weight_decay, momentum, dampening, nesterov,
               maximize, found_inf=None, grad_scale=None, *, dtype_of: Callable,
               place: Callable = lambda what: contextlib.nullcontext()):
    """The op's results (params, momentum buffers after the step, the
    unscaled grads: ``grad_scale`` as for Adam). With
    momentum and no buffers given, it is the first step: each buffer starts
    as the gradient, as torch's SGD does; without momentum there are none.
    ``found_inf`` as for Adam (never with a first step: a skipped first
    step would leave no buffers, lazy_mlir.trace.fused_optimizer does not fuse it)."""
    new_params, new_buffers, unscaled = [], [], []
    for i, (param, grad) in enumerate(zip(params, grads)):
        with place(i):
            if grad_scale is not None:
                grad = _unscaled(emit, grad, grad_scale, dtype_of(grad))
                unscaled.append(grad)
            if maximize:
                grad = emit(aten.neg.default, grad)
            if weight_decay != 0:
                grad = emit(aten.add.Tensor, grad, param, alpha=weight_decay)
            if momentum != 0:
                if momentum_buffers:
                    buf = emit(aten.add.Tensor, emit(aten.mul.Tensor, momentum_buffers[i], momentum), grad,
                               alpha=1 - dampening)
                else:
                    buf = emit(aten.clone.default, grad)
                new_buffers.append(buf)
                grad = emit(aten.add.Tensor, grad, buf, alpha=momentum) if nesterov else buf
            dtype = dtype_of(param)
            step_lr = emit(aten._to_copy.default, lr,
                           dtype=torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
            # param.add_(grad, alpha=-lr)
            new_params.append(emit(aten.sub.Tensor, param, emit(aten.mul.Tensor, grad, step_lr)))
            if found_inf is not None:
                kept = _keeper(emit, found_inf)
                new_params[i] = kept(param, new_params[i])
                if new_buffers:
                    new_buffers[i] = kept(momentum_buffers[i], new_buffers[i])
    return new_params, new_buffers, unscaled


def placer(graph: torch.fx.Graph, inputs_of: Callable):
    """``place(i)`` for an expansion: parameter ``i``'s update goes right
    after the last of its inputs (its gradient), not at the node's place
    after the whole backward: where the op-by-op trace has it (LTC lowers
    in post-order from each output), and where Inductor's fusion and buffer
    reuse did well with it."""
    order = {node: n for n, node in enumerate(graph.nodes)}
    first_op = next((node for node in graph.nodes if node.op != "placeholder"), None)

    def place(i):
        latest = max(inputs_of(i), key=lambda node: order.get(node, -1))
        if latest.op == "placeholder":  # reads the inputs only: before every other op
            return graph.inserting_before(first_op) if first_op is not None else contextlib.nullcontext()
        return graph.inserting_before(latest.next)  # (inserting_after would put each new node first)

    return place


def expand_adam_step(emit: Callable, graph: torch.fx.Graph, args: list) -> tuple[list, ...]:
    """The FX expansion of one ``lazy_mlir::adam_step`` call (``args``: its
    schema arguments in order, tensors as FX nodes) into ``graph``."""
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, scalars, scalar_rows = args[:7]
    amp = [a for a in args[14:16] if a is not None]  # found_inf, grad_scale

    def inputs_of(i):
        return [params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], scalars[scalar_rows[i]]] + (
            [max_exp_avg_sqs[i]] if max_exp_avg_sqs else []) + amp

    return adam_update(emit, *args, dtype_of=lambda node: node.meta["val"].dtype, place=placer(graph, inputs_of))


def expand_sgd_step(emit: Callable, graph: torch.fx.Graph, args: list) -> tuple[list, ...]:
    """The FX expansion of one ``lazy_mlir::sgd_step`` call, as above."""
    params, grads, buffers, lr = args[:4]
    amp = [a for a in args[9:11] if a is not None]  # found_inf, grad_scale

    def inputs_of(i):
        return [params[i], grads[i], lr] + ([buffers[i]] if buffers else []) + amp

    return sgd_update(emit, *args, dtype_of=lambda node: node.meta["val"].dtype, place=placer(graph, inputs_of))


EXPANSIONS = {ADAM_STEP: expand_adam_step, SGD_STEP: expand_sgd_step}


# ------------------------------------------------------------------ the ops
# Defined here, beside their expansion: every process that lowers or runs
# them (a compile worker too) has them once it imports the lowering.
def _eager_adam_step(*args):
    """The op run eagerly (O0, or a group left to TorchScript): the same
    per-tensor math the compiled expansion runs."""
    with torch.no_grad():
        return adam_update(lambda target, *a, **k: target(*a, **k), *args, dtype_of=lambda t: t.dtype)


def _meta_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *rest, grad_scale=None):
    grad_scale = rest[10] if len(rest) > 10 else grad_scale
    written = params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, grads if grad_scale is not None else []
    return tuple([torch.empty_like(t) for t in ts] for ts in written)


def _eager_sgd_step(*args):
    with torch.no_grad():
        return sgd_update(lambda target, *a, **k: target(*a, **k), *args, dtype_of=lambda t: t.dtype)


def _meta_sgd_step(params, grads, momentum_buffers, lr, weight_decay, momentum, *rest, grad_scale=None):
    grad_scale = rest[4] if len(rest) > 4 else grad_scale
    return ([torch.empty_like(t) for t in params], [torch.empty_like(t) for t in params] if momentum != 0 else [],
            [torch.empty_like(t) for t in grads] if grad_scale is not None else [])


_LIB = torch.library.Library("lazy_mlir", "FRAGMENT")
for _schema, _name, _eager, _meta in ((ADAM_STEP_SCHEMA, "adam_step", _eager_adam_step, _meta_adam_step),
                                      (SGD_STEP_SCHEMA, "sgd_step", _eager_sgd_step, _meta_sgd_step)):
    _LIB.define(_schema)
    for _key in ("CPU", "CUDA"):
        _LIB.impl(_name, _eager, _key)
    _LIB.impl(_name, _meta, "Meta")
