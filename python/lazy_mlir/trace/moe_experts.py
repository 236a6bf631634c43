"""Mixture-of-experts layers that loop over their experts in Python, run in
one graph on the lazy device.

transformers' Switch Transformers and NLLB-MoE experts
(``SwitchTransformersExperts``, ``NllbMoeExperts``) run, for a routing mask
``mask[k, j, t]`` (pair ``j`` of token ``t`` goes to expert ``k``) and
weights ``weights[t, j]``::

    hit = (mask.sum(...) > 0).nonzero()       # the experts that got tokens
    for k in hit:
        j, t = torch.where(mask[k])           # their pairs
        out = expert_k(h[t]) * weights[t, j]
        final.index_add_(0, t, out)

On the lazy device each ``nonzero`` and ``where`` reads a value (the step
traced so far executes) and every count of tokens is a new shape: tiny
Switch took 15 graph executions a step and compiled again at each new
routing. On lazy tensors their forward is replaced by one of static shapes,
calling the same expert modules:
- Switch: its router keeps at most ``expert_capacity`` tokens of a sequence
  for each expert, so each expert gets ``batch * min(length, capacity)``
  rows (its block passes the bound): its tokens gathered in token order as
  the loop takes them, the rows left over reading a zero token of weight 0,
  the results added back with ``index_add`` in the loop's order.
- NLLB-MoE (and Switch where the bound is every token): every expert runs
  on every token and keeps its routed pairs,
  ``final += where(routed, expert_k(h) * weights, 0)``, NLLB-MoE's token
  dropout applied per pair as there. (transformers' NLLB-MoE indexes its
  experts by mask value, 0 or 1: experts 0 and 1 see every pair; kept.)
The same values (a routed token's rows are computed as eagerly, nothing
else adds more than an exact 0), no read in the forward. It costs FLOPs where
the bound exceeds an expert's tokens: with E experts, Switch computes
``E * batch * min(length, capacity)`` rows where eager computes one a token.

Two things it cannot make the same as eager:
- An expert that got no token is not called eagerly: its parameters'
  gradients stay None, and the optimizer skips them (no weight decay, no
  moment decay, no step count). Here it runs and gets zero gradients. So
  before an optimizer steps, the experts hit since its last step are read
  (one read: every live tensor is synced, the step's forward and backward
  run as one graph and the optimizer as a second) and the gradients of the
  experts that got no token, and had none before, are set to None. A step
  whose set of skipped parameters is new traces a new optimizer graph.
  ``Config.moe_eager_grads=False`` leaves them zero, as GShard-style MoE
  code does (the optimizer updates those experts): no read, one graph.
- Dropout inside an expert draws masks of another shape (the gathered or
  all tokens, not the routed ones), so its masks are not eager's: equal in
  distribution, not in value.
Other transformers versions' loops are left as they are (a warning says so):
the replacement is checked against the source of the forward it replaces.
Under ``lazy_mlir.capture`` (a replay runs no Python) a model with these
experts is not recorded while ``moe_eager_grads`` is on: it runs op by op,
with capture's warning naming why.
"""
from __future__ import annotations

import hashlib
import inspect
import warnings
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import config
from ..native import _C
from ..observe import syncs
from . import capture, transformers_compat

SWITCH = "transformers.models.switch_transformers.modeling_switch_transformers"
NLLB_MOE = "transformers.models.nllb_moe.modeling_nllb_moe"
# module -> {class: the sha256 of its forward's source (transformers 5.23.0)}:
# the loop replaced, and for Switch the block that calls it (it passes the
# experts their slot bound) and the router that bounds their tokens
CHECKED = {
    SWITCH: {"SwitchTransformersExperts": "da2e70afb128534670927a971106b9304041e7e16688e047ea8a77953ca7d7f8",
             "SwitchTransformersSparseMLP": "8ce5c337d7491904556edd0b90b1766426518c40b0ce42fd77afc2536ee50776",
             "SwitchTransformersTop1Router": "20d6746a660c91787a09459a842e07861ea9b417bf574a21e5d712b83980f212"},
    NLLB_MOE: {"NllbMoeExperts": "88971f39ff5776b80d754c1cadc786af176d07b8acf0f4f440628772842fb7ec"},
}
LOOPS = {SWITCH: "SwitchTransformersExperts", NLLB_MOE: "NllbMoeExperts"}
_MARK = "_lazy_mlir_static_experts"
_SLOTS = "_lazy_mlir_slots"  # set on Switch's experts by their block for its next call

# Expert -> (whether its parameters had no gradient at its first call since
# the last optimizer step, the lazy flag of whether it got a pair since then)
_since_step: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[bool, torch.Tensor]]" = weakref.WeakKeyDictionary()
_hooks: list = []


def install() -> None:
    """Replaces the loops on lazy tensors as their modules are imported, and
    installs the optimizer hook that gives unhit experts None gradients."""
    for module in CHECKED:
        transformers_compat.when_imported(module, patch)
    if not _hooks:
        _hooks.append(register_optimizer_step_pre_hook(_before_optimizer_step))


def source_digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def patch(module, checked: dict | None = None, loop: str | None = None) -> bool:
    """Replaces the loop of ``module`` (a transformers modeling module) if
    its checked classes are the ones this mirrors; returns whether."""
    checked = CHECKED[module.__name__] if checked is None else checked
    loop = LOOPS[module.__name__] if loop is None else loop
    classes = {name: getattr(module, name, None) for name in checked}
    if classes[loop] is None or getattr(classes[loop].forward, _MARK, False):
        return False
    for name, cls in classes.items():
        if cls is None or source_digest(cls.forward) != checked[name]:
            warnings.warn(f"lazy_mlir: {module.__name__}.{name}.forward is not the one lazy_mlir's static "
                          f"{loop} loop mirrors (transformers 5.23.0's); on the lazy device that loop runs as "
                          "written: a value read per expert and a compile per routing", RuntimeWarning, stacklevel=2)
            return False
    classes[loop].forward = _static_on_lazy(classes[loop].forward)
    if module.__name__ == SWITCH:
        block = classes["SwitchTransformersSparseMLP"]
        block.forward = _passing_slot_bound(block.forward)
    return True


def _passing_slot_bound(block_forward):
    def forward(self, hidden_states):
        if transformers_compat.is_lazy(hidden_states):
            batch, length, _ = hidden_states.shape
            # the router keeps at most expert_capacity tokens of a sequence for each expert
            setattr(self.experts, _SLOTS, batch * min(length, self.router.expert_capacity))
        return block_forward(self, hidden_states)

    forward.__wrapped__ = block_forward
    return forward


def _static_on_lazy(loop):
    def forward(self, hidden_states, mask, weights):
        if not transformers_compat.is_lazy(hidden_states):
            return loop(self, hidden_states, mask, weights)
        if type(self).__name__ == "NllbMoeExperts":  # its mask is each pair's 0/1: one_hot makes the classes experts
            return experts_in_one_graph(self, hidden_states, torch.nn.functional.one_hot(
                mask, num_classes=self.num_experts).permute(2, 1, 0), weights, _nllb_token_dropout)
        return experts_in_one_graph(self, hidden_states, mask.permute(2, 1, 0), weights,
                                    slots=self.__dict__.pop(_SLOTS, None))

    setattr(forward, _MARK, True)
    forward.__wrapped__ = loop
    return forward


def _nllb_token_dropout(experts, pairs: torch.Tensor) -> torch.Tensor:
    if experts.moe_token_dropout > 0:
        if experts.training:
            return experts.token_dropout(pairs)
        return pairs * (1 - experts.moe_token_dropout)
    return pairs


def experts_in_one_graph(experts, hidden_states: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                         per_pair=None, slots: int | None = None) -> torch.Tensor:
    """The loop's result in static shapes. ``mask``: (experts, pairs, tokens),
    nonzero where a token's pair goes to the expert; ``weights``: (tokens,
    pairs); ``per_pair(experts, pairs)``: what the loop does to each routed
    pair's rows before adding them (tokens, pairs, hidden). ``slots``: at
    most that many tokens go to each expert (one pair a token): each
    expert then computes that many rows, gathered, not every token's."""
    tokens = hidden_states.shape[0]
    if slots is not None and slots < tokens and mask.shape[1] == 1 and per_pair is None:
        return _gathered(experts, hidden_states, mask[:, 0], weights[:, 0], slots)
    final = torch.zeros_like(hidden_states)
    for k in range(mask.shape[0]):
        routed = (mask[k] != 0).transpose(0, 1)  # (tokens, pairs)
        expert = experts[f"expert_{k}"]
        pairs = expert(hidden_states).unsqueeze(1) * weights.unsqueeze(-1)
        if per_pair is not None:
            pairs = per_pair(experts, pairs)
        final = final + torch.where(routed.unsqueeze(-1), pairs, 0).sum(1).to(final.dtype)
        _record(expert, routed.any())
    return final


def _gathered(experts, hidden_states, mask, weights, slots: int) -> torch.Tensor:
    """Each expert's tokens in ``slots`` rows, in token order as the loop
    takes them (``where``), the rows left over reading a zero token of
    weight 0 (row ``tokens``) and added to it, dropped at the end."""
    tokens = hidden_states.shape[0]
    device = hidden_states.device
    padded = torch.cat([hidden_states, hidden_states.new_zeros(1, hidden_states.shape[1])])
    padded_weights = torch.cat([weights, weights.new_zeros(1)]).unsqueeze(-1)
    every_token = torch.arange(tokens, device=device)
    final = torch.zeros_like(padded)
    for k in range(mask.shape[0]):
        routed = mask[k] != 0
        position = torch.cumsum(routed, 0) - 1
        # a token past the bound (none: the router caps them) goes to the spare slot, as unrouted ones
        slot = torch.where(routed & (position < slots), position, slots)
        token_of_slot = torch.full((slots + 1,), tokens, device=device).scatter(0, slot, every_token)[:slots]
        expert = experts[f"expert_{k}"]
        rows = expert(padded[token_of_slot]) * padded_weights[token_of_slot]
        final = final.index_add(0, token_of_slot, rows.to(final.dtype))
        _record(expert, routed.any())
    return final[:tokens]


def _record(expert: torch.nn.Module, hit: torch.Tensor) -> None:
    if not config.current.moe_eager_grads or not torch.is_grad_enabled():
        return
    if capture.recording():  # a replay would run no Python: no experts hit to read
        raise RuntimeError("lazy_mlir.trace.moe_experts: eager's None gradients for experts that get no token need "
                           "the forward's Python at each step; init(moe_eager_grads=False) lets a captured "
                           "model replay its experts (zero gradients)")
    params = [p for p in expert.parameters() if p.requires_grad]
    if not params:
        return
    had_none, hits = _since_step.get(expert, (all(p.grad is None for p in params), None))
    _since_step[expert] = had_none, hit if hits is None else hits | hit


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    """Gives the experts that got no token since the last step None
    gradients, as eager's loop leaves them (the optimizer then skips them)."""
    if torch.compiler.is_compiling() or not _since_step:
        return
    if not config.current.moe_eager_grads:  # switched off since they were recorded
        _since_step.clear()
        return
    pending = [(expert, hits) for expert, (had_none, hits) in _since_step.items() if had_none]
    _since_step.clear()
    if not pending:
        return
    flags = torch.stack([hits for _, hits in pending])
    with syncs.planned_read("lazy_mlir.trace.moe_experts reads which experts got tokens"):
        _C.sync_live_tensors(flags)  # forward and backward as one graph: not recomputed for the read
    hit = flags.cpu().tolist()  # data now: no execution
    unhit = [expert for (expert, _), was_hit in zip(pending, hit) if not was_hit]
    for expert in unhit:
        for p in expert.parameters():
            p.grad = None
