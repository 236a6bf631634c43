"""Switch Transformers' and NLLB-MoE's Python loops over their experts run
in static shapes on the lazy device (lazy_mlir.trace.moe_experts): the same
losses, parameters and optimizer state as eager, two graph executions a
step (forward and backward, then the optimizer, around the read of which
experts got tokens), no eager op. The tiny Switch's capacity (6 of 8
tokens a sequence) makes its experts gather their tokens; NLLB-MoE's run
on every token. In fp64: the routers' fp32 (their
config admits no fp64) is set to fp64 on the modules; Switch's layer norm
computes its variance in fp32 all the same, so Switch is held to the noise
floor (eager against eager with the weights scaled by 1 + 1e-7), as the
zoo holds T5."""
from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics
from lazy_mlir.trace import moe_experts
from helpers import end_step

STEPS = 4
LAZY = torch.device("lazy")
FP64 = dict(rtol=1e-9, atol=1e-10)


def _switch():
    from transformers import SwitchTransformersConfig, SwitchTransformersEncoderModel
    cfg = SwitchTransformersConfig(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                   num_sparse_encoder_layers=1, num_heads=4, num_experts=4, expert_capacity=6,
                                   dropout_rate=0.0, router_jitter_noise=0.0, pad_token_id=0)
    return SwitchTransformersEncoderModel._from_config(cfg, attn_implementation="eager")


def _nllb():
    from transformers import NllbMoeConfig, NllbMoeModel
    cfg = NllbMoeConfig(vocab_size=32, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_experts=4,
                        expert_capacity=6, encoder_sparse_step=2, decoder_sparse_step=0, max_position_embeddings=32,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, moe_token_dropout=0.0,
                        encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=0, bos_token_id=0,
                        eos_token_id=1, decoder_start_token_id=0)
    return NllbMoeModel._from_config(cfg, attn_implementation="eager")


MODELS = {"switch": _switch, "nllb_moe": _nllb}


def _build(name: str, perturb: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]().double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + perturb)
    for module in model.modules():
        if hasattr(module, "classifier") and hasattr(module, "expert_capacity"):  # a router
            module.dtype = torch.float64
    return model


def _loss(name, model, ids):
    if name == "switch":
        hidden = model(input_ids=ids).last_hidden_state
    else:
        hidden = model(input_ids=ids, decoder_input_ids=ids[:, :4]).encoder_last_hidden_state
    return F.mse_loss(hidden, torch.ones_like(hidden))


def _train(name: str, device: torch.device, perturb: float = 0.0, captured: bool = False):
    model = _build(name, perturb)
    if captured:
        lazy_mlir.capture(model)
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses, per_step = [], []
    for _ in range(STEPS):
        ids = torch.randint(2, 32, (2, 8), generator=g).to(device)
        if device == LAZY:
            metrics.reset()
        loss = _loss(name, model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        end_step(device, loss, losses, per_step)
    with torch.no_grad():
        params = {n: p.cpu() for n, p in model.named_parameters()}
    stepped = {n: int(opt.state[p]["step"]) for n, p in model.named_parameters() if p in opt.state}
    return torch.tensor(losses, dtype=torch.float64), params, stepped, per_step


_runs: dict = {}


def _runs_of(name):
    if name not in _runs:
        _runs[name] = _train(name, torch.device("cpu")), _train(name, LAZY)
    return _runs[name]


def _max_diffs(losses, params, other_losses, other_params) -> tuple[float, float]:
    return ((losses - other_losses).abs().max().item(),
            max((p - other_params[n]).abs().max().item() for n, p in params.items()))


@pytest.mark.parametrize("name", MODELS)
def test_trains_as_eager(lazy_level, name):
    (losses, params, stepped, _), (lazy_losses, lazy_params, lazy_stepped, _) = _runs_of(name)
    if name == "switch":
        floor_losses, floor_params, _, _ = _train(name, torch.device("cpu"), perturb=1e-7)
        floor = _max_diffs(losses, params, floor_losses, floor_params)
        diffs = _max_diffs(losses, params, lazy_losses, lazy_params)
        assert all(d <= 10 * f for d, f in zip(diffs, floor)), f"(loss, param) diffs {diffs} vs noise floor {floor}"
    else:
        torch.testing.assert_close(lazy_losses, losses, **FP64)
        for n, p in params.items():
            torch.testing.assert_close(lazy_params[n], p, **FP64, msg=n)
    # Experts that got no token were skipped by AdamW eagerly (None
    # gradients): so they were here, at the same steps.
    experts = [n for n in params if ".expert_" in n]
    assert any(stepped.get(n, 0) < STEPS for n in experts), "every expert got tokens at every step: nothing checked"
    assert lazy_stepped == stepped


@pytest.mark.parametrize("name", MODELS)
def test_two_graphs_a_step_no_eager_op(lazy_level, name):
    _, (_, _, _, per_step) = _runs_of(name)
    read = "lazy_mlir.trace.moe_experts reads which experts got tokens"
    for i, s in enumerate(per_step):
        assert s["mark_steps"] == 1 and s["graph_executions"] == 2, (i, s)
        assert s["fallback_count"] == 0, (i, s["fallbacks"])
        assert list(s["syncs"]) and all(source.startswith(read) for source in s["syncs"]), (i, s["syncs"])
        assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] > 0, (i, s)
        assert i == 0 or s["interpreted_group_calls"] == 0, (i, s)  # step 0 runs TorchScript while it compiles
    # The forward and backward graph compiles at step 0 only (a refused
    # automatic record kept the model's output alive into step 0's graph
    # until capture released its frames: a second compile at step 1). Later
    # misses: the optimizer's, for another set of experts stepping.
    assert per_step[0]["groups_built"] > 0 and all(s["cache_misses"] <= 1 for s in per_step[1:]), per_step


def test_zero_gradients_when_asked_one_graph_a_step():
    """moe_eager_grads=False: experts that got no token keep zero gradients
    and AdamW steps them all (GShard-style); no read, one execution a step.
    The routed experts' math is the same: step 0's loss is eager's. The
    model captured trains as traced op by op."""
    lazy_mlir.init("O1", moe_eager_grads=False)
    try:
        (losses, _, stepped, _), _ = _runs_of("nllb_moe")
        lazy_losses, lazy_params, lazy_stepped, per_step = _train("nllb_moe", LAZY)
        # captured too (nothing to read: its replay needs no Python)
        captured_losses, captured_params, captured_stepped, captured_steps = _train("nllb_moe", LAZY, captured=True)
    finally:
        lazy_mlir.init("O1")
    for steps in (per_step, captured_steps):
        assert all(s["graph_executions"] == s["mark_steps"] == 1 and not s["syncs"] for s in steps), steps
    assert set(lazy_stepped) > set(stepped)  # eagerly, some experts never stepped
    assert all(count == STEPS for n, count in lazy_stepped.items() if ".expert_" in n)
    torch.testing.assert_close(lazy_losses[0], losses[0], **FP64)
    assert all(s["captured_calls"] == 1 and not s["capture_refused"] for s in captured_steps), captured_steps
    torch.testing.assert_close(captured_losses, lazy_losses, **FP64)
    for n, p in lazy_params.items():
        torch.testing.assert_close(captured_params[n], p, **FP64, msg=n)
    assert captured_stepped == lazy_stepped


def test_a_captured_model_runs_op_by_op_to_keep_eagers_gradients(lazy_level):
    """A captured forward replays without its Python, so no expert's hits
    would be recorded: capture refuses it, saying why, and the step traces
    op by op with eager's None gradients."""
    (losses, params, stepped, _), _ = _runs_of("nllb_moe")
    with pytest.warns(UserWarning, match="could not be recorded.*moe_eager_grads=False"):
        lazy_losses, lazy_params, lazy_stepped, _ = _train("nllb_moe", LAZY, captured=True)
    torch.testing.assert_close(lazy_losses, losses, **FP64)
    assert lazy_stepped == stepped


def test_another_transformers_loop_is_left_as_it_is():
    class Experts(torch.nn.Module):
        def forward(self, hidden_states, mask, weights):
            return hidden_states

    module = types.SimpleNamespace(__name__="transformers.models.x.modeling_x", Experts=Experts)
    loop = Experts.forward
    with pytest.warns(RuntimeWarning, match="modeling_x.Experts.forward is not the one lazy_mlir's static"):
        assert not moe_experts.patch(module, {"Experts": "0" * 64}, "Experts")
    assert Experts.forward is loop
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert moe_experts.patch(module, {"Experts": moe_experts.source_digest(loop)}, "Experts")  # its digest
    assert Experts.forward is not loop and Experts.forward.__wrapped__ is loop
