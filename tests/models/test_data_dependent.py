"""Ops with data-dependent sizes stay in the step (trace/data_dependent.py):
a CTC model and a graph convolution, written here as their libraries write
them (data_dependent_models.py), trained in float64 against eager, with the
graph executions, count reads, eager fallbacks and compiles of every step
counted while the counts change from batch to batch."""
from __future__ import annotations

import pytest
import torch

import data_dependent_models as models
import lazy_mlir
from helpers import end_step
from lazy_mlir.observe import metrics

# Compiles per step are counted: new sizes compile in the step that brings
# them (shape-generic code too), not in the background while it runs in TorchScript.
pytestmark = pytest.mark.compiles_in_step

LAZY = torch.device("lazy")
STEPS = 8
FP64 = dict(rtol=1e-10, atol=1e-10)

FAMILIES = {
    # the loss's flattening by masked_select: one count read a step
    "ctc_masked_select": (models.CtcModel, models.ctc_batches, models.ctc_loss_step, 1),
    # padded targets: no read, one graph execution a step
    "ctc_padded": (models.CtcModel, models.ctc_batches, models.ctc_loss_step_padded, 0),
    # Hugging Face's loss flattens so too; its label check is a read of its own
    "wav2vec2_ctc": (models.wav2vec2_ctc, models.audio_batches, models.wav2vec2_loss_step, 2),
    # each layer removes self-loops with a boolean index: the same mask, read once
    "gcn": (models.Gcn, models.graph_batches, models.gcn_loss_step, 1),
}
# Wav2Vec2ForCTC takes the log-softmax in fp32 whatever the model's dtype: it
# is held to the noise floor (eager against eager with the weights scaled by
# 1 + 1e-7, an fp32 rounding), as the zoo holds such models.
FP32_ISLANDS = {"wav2vec2_ctc"}


def _train(name: str, device: torch.device, perturb: float = 0.0):
    make, batches, loss_step, _ = FAMILIES[name]
    torch.manual_seed(0)
    model = make().double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + perturb)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, per_step = [], []
    for batch in batches(STEPS):
        batch = [t.to(device) for t in batch]
        if device == LAZY:
            metrics.reset()
        loss = loss_step(model, *batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        end_step(device, loss, losses, per_step)
    with torch.no_grad():
        params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return torch.tensor(losses, dtype=torch.float64), params, per_step


def _counts(name: str) -> list:
    """What the data-dependent sizes of each step depend on."""
    _, batches, _, _ = FAMILIES[name]
    if name == "gcn":
        return [int((edges[0] != edges[1]).sum()) for _, edges, _ in batches(STEPS)]
    return [int((batch[1] >= 0).sum()) for batch in batches(STEPS)]


_runs: dict = {}


def _runs_of(name):
    if name not in _runs:
        _runs[name] = _train(name, torch.device("cpu")), _train(name, LAZY)
    return _runs[name]


def _assert_same_training(name, reference, run) -> None:
    """Losses and final parameters in float64 (FP32_ISLANDS: within ten
    times the noise floor)."""
    (losses, params, _), (run_losses, run_params, _) = reference, run
    if name in FP32_ISLANDS:
        floor_losses, floor_params, _ = _train(name, torch.device("cpu"), perturb=1e-7)
        floor = _max_diffs(losses, params, floor_losses, floor_params)
        diffs = _max_diffs(losses, params, run_losses, run_params)
        assert all(d <= 10 * f for d, f in zip(diffs, floor)), f"(loss, param) diffs {diffs} vs noise floor {floor}"
        return
    torch.testing.assert_close(run_losses, losses, **FP64)
    for n, p in params.items():
        torch.testing.assert_close(run_params[n], p, **FP64, msg=n)


@pytest.mark.parametrize("name", FAMILIES)
def test_trains_as_eager(lazy_level, name):
    eager, lazy = _runs_of(name)
    _assert_same_training(name, eager, lazy)


@pytest.mark.parametrize("name", FAMILIES)
def test_trains_as_at_o0(lazy_level, name):
    """The same steps with nothing compiled (O0: all of it in TorchScript)."""
    _, lazy = _runs_of(name)  # at O1, before the switch
    lazy_mlir.init("O0")
    _assert_same_training(name, _train(name, LAZY), lazy)


def _max_diffs(losses, params, other_losses, other_params) -> tuple[float, float]:
    return ((losses - other_losses).abs().max().item(),
            max((p - other_params[n]).abs().max().item() for n, p in params.items()))


@pytest.mark.parametrize("name", FAMILIES)
def test_no_eager_op_and_the_reads_named(lazy_level, name):
    _, (_, _, per_step) = _runs_of(name)
    reads = FAMILIES[name][3]
    for i, s in enumerate(per_step):
        assert s["fallback_count"] == 0, (i, s["fallbacks"])
        assert s["graph_executions"] == 1 + reads and sum(s["syncs"].values()) == reads, (i, s["syncs"])
        ours = [source for source in s["syncs"] if source.startswith("lazy_mlir reads how many elements")]
        theirs = [source for source in s["syncs"] if "modeling_wav2vec2.py" in source]  # labels.max() >= vocab
        assert len(ours) + len(theirs) == len(s["syncs"]) and len(theirs) == (name == "wav2vec2_ctc"), s["syncs"]
        assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] > 0, (i, s)


def _new_code(s: dict) -> int:
    """Groups whose code was generated in a step: cache misses that no
    shape-generic variant served, and generic compiles."""
    return s["group_cache_misses"] - s["generic_hits"] + s["generic_compiles"]


@pytest.mark.parametrize("name", FAMILIES)
def test_no_code_generated_past_the_second_count(lazy_level, name):
    """The counts change (so do the sizes after the read); from the second
    distinct count on, shape-generic code serves every later one. (Each new
    count is still a new LTC graph, lowered and clustered again: ``compiles``.)"""
    _, (_, _, per_step) = _runs_of(name)
    counts = _counts(name)
    assert len(set(counts)) >= 3, counts  # else nothing is checked past the second
    second = next(i for i, c in enumerate(counts) if c != counts[0])
    assert per_step[0]["groups_built"] > 0
    late = [_new_code(s) for s in per_step[second + 1:]]
    assert sum(late) == 0, (counts, [_new_code(s) for s in per_step])
    if name != "ctc_padded":  # the sizes did change, and generic code served them
        assert sum(s["generic_hits"] for s in per_step[second + 1:]) > 0, (counts, per_step)


def _data_dependent_ops(x, mask, counts, weights):
    return [x.nonzero(), x.masked_select(mask), x[mask], x[:, mask[0]], x.masked_select(mask[0]),
            torch.argwhere(x > 5), torch.repeat_interleave(counts), x.repeat_interleave(counts[:3], dim=0),
            torch.bincount(counts), torch.bincount(counts, weights=weights, minlength=9),
            *torch.unique(x.remainder(5), return_inverse=True, return_counts=True), torch.unique(counts),
            *torch.unique_consecutive(torch.cat([counts, counts.flip(0)]), return_inverse=True, return_counts=True),
            torch.unique(torch.cat([x.flatten(), x.flatten() / 0.0]))]  # NaNs: each one distinct


def test_every_data_dependent_op_with_a_rule_is_traced(lazy_level):
    """One size read each, nothing eager, eager's sizes and values (also when
    used again in the same step)."""
    x = torch.arange(12.0).reshape(3, 4)
    mask = x.remainder(3) == 0
    counts, weights = torch.tensor([2, 0, 3, 1]), torch.tensor([0.5, 1.0, 2.0, 4.0])
    expected = _data_dependent_ops(x, mask, counts, weights)
    metrics.reset()
    results = _data_dependent_ops(x.to(LAZY), mask.to(LAZY), counts.to(LAZY), weights.to(LAZY))
    total = sum(r.sum() for r in results[:-1])  # used again in the step (the NaNs' sum aside)
    torch._lazy.mark_step()
    s = metrics.snapshot()
    for got, want in zip(results, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    torch.testing.assert_close(total.cpu(), sum(r.sum() for r in expected[:-1]))
    assert s["fallback_count"] == 0, s["fallbacks"]
    assert sum(s["syncs"].values()) == len(results) - 4, s["syncs"]  # one read each (a unique's three: one)
    assert all(source.startswith("lazy_mlir reads ") for source in s["syncs"]), s["syncs"]


def test_a_mask_computed_again_from_the_same_data_is_read_once(lazy_level):
    """The count of a mask is kept for the step by what the mask is computed
    from (its ops and the data they read): the same ops on the same data are
    not read again; the same ops on other data, or on random draws, are."""
    edges, other = torch.tensor([[0, 1, 2, 2], [0, 2, 2, 1]]), torch.tensor([[0, 1, 1, 3], [1, 1, 2, 3]])
    le, lo = edges.to(LAZY), other.to(LAZY)
    metrics.reset()
    first = le[:, le[0] != le[1]]
    again = le[:, le[0] != le[1]]  # the same data: no read
    elsewhere = lo[:, lo[0] != lo[1]]  # the same ops, other data (same sizes): read
    drawn = le.masked_select(torch.rand(4, device=LAZY) > 0.5)  # random: read
    torch._lazy.mark_step()
    assert sum(metrics.snapshot()["syncs"].values()) == 3, metrics.snapshot()["syncs"]
    torch.testing.assert_close(first.cpu(), edges[:, edges[0] != edges[1]])
    torch.testing.assert_close(again.cpu(), edges[:, edges[0] != edges[1]])
    torch.testing.assert_close(elsewhere.cpu(), other[:, other[0] != other[1]])
    assert drawn.shape[0] <= 8
    metrics.reset()
    le[:, le[0] != le[1]]  # a new step reads again
    torch._lazy.mark_step()
    assert sum(metrics.snapshot()["syncs"].values()) == 1


def test_a_boolean_index_of_the_same_sizes_reads_its_count_again(lazy_level):
    """The C++ front that reuses a builtin call's output sizes for a call of
    the same argument sizes (kernel_fronts.h) never takes a boolean index:
    masks of one shape select different counts."""
    x = torch.arange(8.0)
    lx = x.to(LAZY)
    for mask in ([1, 0, 1, 0, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]):
        mask = torch.tensor(mask, dtype=torch.bool)
        picked = lx[mask.to(LAZY)]
        torch._lazy.mark_step()
        assert picked.shape == x[mask].shape
        torch.testing.assert_close(picked.cpu(), x[mask])
