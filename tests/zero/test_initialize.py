"""zero.initialize is all-or-nothing: whatever fails, and wherever (its
checks, the broadcasts, the changes to the model, the ranks' final
agreement), the model's parameters, their hooks, the optimizer and
lazy_mlir's configuration are as before. In-process, on a one-rank gloo
group; the model then still initializes and trains like a fresh one."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

import lazy_mlir
import lazy_mlir.zero as zero
from lazy_mlir import config
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt
from lazy_mlir.zero.engine import ZeroEngine

CONFIG = GPTConfig(n_layer=1, n_head=2, n_embd=36, vocab_size=50, block_size=8, batch_size=2)


def _snapshot(model, optimizer) -> dict:
    params = {}
    with torch.no_grad():  # p.cpu() of device data runs no graph
        for name, p in model.named_parameters(remove_duplicate=False):
            params[name] = (id(p), torch._C._lazy._get_tensor_id(p) if p.device.type == "lazy" else None,
                            p.device, tuple(p.shape), p.requires_grad, len(p._post_accumulate_grad_hooks or {}),
                            p.cpu().clone())
    groups = [({k: v for k, v in g.items() if k != "params"}, [id(p) for p in g["params"]])
              for g in optimizer.param_groups]
    return {"params": params, "pre_hooks": len(model._forward_pre_hooks), "hooks": len(model._forward_hooks),
            "engine": hasattr(model, "_lazy_mlir_zero"), "groups": groups, "opt_state": dict(optimizer.state),
            "config": dataclasses.asdict(config.current)}


def _assert_unchanged(before: dict, after: dict) -> None:
    assert after.keys() == before.keys()
    for key in before:
        if key != "params":
            assert after[key] == before[key], key
    assert after["params"].keys() == before["params"].keys()
    for name, (*meta, values) in before["params"].items():
        *meta_after, values_after = after["params"][name]
        assert meta_after == meta, name  # same Parameter, same lazy data, shape, hooks
        torch.testing.assert_close(values_after, values, rtol=0, atol=0, msg=name)


def _lazy_gpt():
    return make_gpt(CONFIG).to("lazy")


def _cpu_param(model, optimizer):
    model.blocks[0].mlp.c_proj.to("cpu")  # a submodule the user forgot to move


def _foreign_tensor(model, optimizer):
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3).to("lazy"))]})


def _fail_nth(monkeypatch, owner, name, n, wrap_result=False):
    """Makes ``owner.name`` raise at its ``n``-th call (earlier calls run the
    original): a failure partway through."""
    original = getattr(owner, name)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, failing)
    return calls


def _fail_broadcast(monkeypatch, model, optimizer):
    _fail_nth(monkeypatch, ZeroEngine, "_broadcast", 5)


def _fail_hook(monkeypatch, model, optimizer):
    # fails with two parameters given new data and gradient hooks (in stage 3, emptied)
    _fail_nth(monkeypatch, torch.Tensor, "register_post_accumulate_grad_hook", 3)


def _fail_after_pipeline(monkeypatch, model, optimizer):
    # everything done (parameters, hooks, the zero pipeline installed), then an error
    original = zero._use_zero_pipeline

    def install_then_fail(engine):
        original(engine)
        assert "zero-insert-gather" in config.current.pipeline
        raise RuntimeError("injected failure after the pipeline")
    monkeypatch.setattr(zero, "_use_zero_pipeline", install_then_fail)


def _fail_agreement(monkeypatch, model, optimizer):
    # the ranks' last agreement fails (a peer died): every change is undone
    _fail_nth(monkeypatch, dist, "all_reduce", 2)


FAILURES = {
    "bad_stage": (None, {"stage": 4}, ValueError, "stage must be 1, 2 or 3"),
    "bad_reduce_scatter": (None, {"reduce_scatter": "ring"}, ValueError, "reduce_scatter must be"),
    "offload_below_stage_3": (None, {"stage": 2, "offload_optimizer": True}, ValueError,
                              "offload_optimizer needs stage=3"),
    # a world of one rank: blocks of 2 do not divide it
    "bad_shard_group_size": (None, {"shard_group_size": 2}, ValueError, "shard_group_size must divide the group's 1"),
    "cpu_parameter": (_cpu_param, {}, ValueError, r"parameter blocks\.0\.mlp\.c_proj\.weight is on cpu"),
    "foreign_tensor": (_foreign_tensor, {}, ValueError, "not a trainable parameter of the model"),
    "broadcast": (_fail_broadcast, {}, RuntimeError, "injected failure in _broadcast"),
    "grad_hook": (_fail_hook, {}, RuntimeError, "injected failure in register_post_accumulate_grad_hook"),
    "after_pipeline": (_fail_after_pipeline, {}, RuntimeError, "injected failure after the pipeline"),
    "agreement": (_fail_agreement, {}, RuntimeError, "injected failure in all_reduce"),
}


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_initialize_changes_nothing(failure, stage, lazy_level, gloo_world, monkeypatch):
    setup, options, error, message = FAILURES[failure]
    model = _lazy_gpt()
    optimizer = make_adamw(model)
    if setup in (_cpu_param, _foreign_tensor):
        setup(model, optimizer)
    elif setup is not None:
        setup(monkeypatch, model, optimizer)
    before = _snapshot(model, optimizer)
    with pytest.raises(error, match=message):
        zero.initialize(model, optimizer, **{"stage": stage, "persistence_threshold": 40, **options})
    _assert_unchanged(before, _snapshot(model, optimizer))


def _train(model, optimizer, steps=2) -> torch.Tensor:
    losses = []
    for x, y in gpt_batches(CONFIG, steps=steps):
        loss = model(x.to("lazy"), y.to("lazy"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch._lazy.mark_step()
        losses.append(loss.item())
    return torch.tensor(losses)


def test_after_a_failure_the_model_initializes_and_trains_like_a_fresh_one(lazy_level, gloo_world, monkeypatch):
    fresh = _lazy_gpt()
    expected = _train(*zero.initialize(fresh, make_adamw(fresh), stage=3, persistence_threshold=40))

    model = _lazy_gpt()
    optimizer = make_adamw(model)
    _fail_hook(monkeypatch, model, optimizer)  # fails with two parameters emptied, with hooks
    with pytest.raises(RuntimeError, match="injected failure"):
        zero.initialize(model, optimizer, stage=3, persistence_threshold=40)
    monkeypatch.undo()
    # no hook of the failed engine left: it would reduce gradients twice or empty parameters
    torch.testing.assert_close(_train(*zero.initialize(model, optimizer, stage=3, persistence_threshold=40)),
                               expected, rtol=0, atol=0)


def test_optimizer_state_round_trip_checks_its_layout(lazy_level, gloo_world):
    model = _lazy_gpt()
    model, optimizer = zero.initialize(model, make_adamw(model), stage=2, persistence_threshold=40)
    _train(model, optimizer, steps=1)
    saved = optimizer.state_dict()
    assert all(v.device.type == "cpu" for entry in saved["state"].values() for v in entry.values())
    step = next(iter(saved["state"].values()))["step"].clone()
    _train(model, optimizer, steps=1)
    assert next(iter(saved["state"].values()))["step"] == step  # a copy: training does not move it

    other = _lazy_gpt()
    other, restored = zero.initialize(other, make_adamw(other), stage=2, persistence_threshold=40)
    restored.load_state_dict(saved)
    again = restored.state_dict()
    for k, entry in saved["state"].items():
        for name, value in entry.items():
            torch.testing.assert_close(again["state"][k][name], value, rtol=0, atol=0)

    # torch's own load_state_dict checks counts, not shapes: a wider model took it
    wider = make_gpt(dataclasses.replace(CONFIG, n_embd=40)).to("lazy")
    wider, wrong = zero.initialize(wider, make_adamw(wider), stage=2, persistence_threshold=40)
    with pytest.raises(ValueError, match="saved with layout"):
        wrong.load_state_dict(saved)
    with pytest.raises(ValueError, match="saved with layout"):  # from a group of another size
        restored.load_state_dict({**saved, "zero": {**saved["zero"], "world_size": 2}})


def test_a_budget_under_the_static_peak_keeps_the_static_schedule(lazy_level, gloo_world):
    """A memory budget the static schedule's measured peak already exceeds
    leaves nothing to plan: no second schedule compiled, the static one
    kept, the reason in the metrics; and a budget outside stage 3 is an error."""
    fresh = _lazy_gpt()
    expected = _train(*zero.initialize(fresh, make_adamw(fresh), stage=3, persistence_threshold=40), steps=6)
    model = _lazy_gpt()
    model, optimizer = zero.initialize(model, make_adamw(model), stage=3, persistence_threshold=40, memory_budget=1)
    pipeline = config.current.pipeline
    torch.testing.assert_close(_train(model, optimizer, steps=6), expected, rtol=0, atol=0)
    plan = lazy_mlir.metrics.snapshot()["zero_schedule"]
    assert plan["chosen"] == "static" and "over the budget" in plan["why"] and "planned" not in plan, plan
    assert plan["static"]["peak_bytes"] > 1 and config.current.pipeline == pipeline
    with pytest.raises(ValueError, match="memory_budget plans stage 3's gathers"):
        other = _lazy_gpt()
        zero.initialize(other, make_adamw(other), stage=2, memory_budget=1 << 30)
