"""init(memory_budget=...): captured modules checkpoint their repeated blocks
to fit a budget for the process's memory (trace/memory_budget.py), training
as eagerly."""
import os
import sys

import pytest
import torch

import lazy_mlir
from lazy_mlir.models import GPTConfig
from lazy_mlir.observe import metrics

from helpers import CPU, LAZY, assert_compiled, assert_same_training, gpt_batches, make_adamw, make_gpt, train

# attention probabilities of 8 x 4 x 128 x 128 doubles (4 MiB a layer): what the step holds most of
CFG = GPTConfig(n_layer=4, n_head=4, n_embd=64, vocab_size=128, block_size=128, batch_size=8)
STEPS = 10  # fraction 0's compile and 3 measured steps, the next fraction's compile and 3, and after


def _make():
    torch.manual_seed(0)
    return make_gpt(CFG).double()


def _batches():
    return list(gpt_batches(CFG, STEPS))


def _train_with_budget(budget, level="O1"):
    lazy_mlir.init(level, memory_budget=budget)
    try:
        metrics.reset()
        lazy = train(_make, make_adamw, _batches(), LAZY)
        return lazy, metrics.snapshot(), metrics.report()
    finally:
        lazy_mlir.init("O1")


@pytest.fixture(scope="module")
def eager():
    return train(_make, make_adamw, _batches(), CPU)


def test_a_budget_nothing_fits_checkpoints_every_block(eager):
    with pytest.warns(UserWarning, match="memory_budget 1 MiB: the step peaks at"):
        lazy, s, _ = _train_with_budget(1 << 20)
    assert_same_training(eager, lazy, rtol=1e-10, atol=1e-10)
    with pytest.warns(UserWarning, match="memory_budget 1 MiB"):  # the same choice, run by TorchScript
        o0, _, _ = _train_with_budget(1 << 20, "O0")
    assert_same_training(o0, lazy, rtol=1e-10, atol=1e-10)
    assert_compiled(s, calls=STEPS)
    mb = s["memory_budget"]
    assert mb["chosen_fraction"] == 1.0 and list(mb["measured"]) == [1.0], mb
    (gpt,) = mb["partitions"]
    # the backward recomputes the blocks, so the forward saves less than the default partition
    assert gpt["blocks"] == CFG.n_layer and gpt[1.0]["recomputed_ops"] > 0, gpt
    assert gpt[1.0]["checkpointed_bytes"] > gpt[1.0]["saved_bytes"] > 0, gpt
    assert s["captured_calls"] == STEPS and s["capture_records"] == 1, metrics.report()


def test_a_budget_with_room_checkpoints_nothing(eager):
    lazy, s, report = _train_with_budget(1 << 40)
    assert_same_training(eager, lazy, rtol=1e-10, atol=1e-10)
    assert_compiled(s, calls=STEPS)
    mb = s["memory_budget"]
    assert mb["chosen_fraction"] == 0.0 and list(mb["measured"]) == [1.0, 0.0], mb
    (gpt,) = mb["partitions"]
    assert gpt[0.0]["saved_bytes"] > 2 * gpt[1.0]["saved_bytes"] and gpt[0.0]["checkpointed_bytes"] == 0, gpt
    # checkpointing lowered what the step's own buffers peaked at
    assert mb["measured"][1.0]["step_buffers_bytes"] < 0.75 * mb["measured"][0.0]["step_buffers_bytes"], mb
    assert s["capture_records"] == 2, metrics.report()
    assert "0% of the repeated blocks checkpointed" in report, report


def test_the_budget_is_checked():
    for bad in (0, -1, 1.5, True, "1G"):
        with pytest.raises(ValueError, match="memory_budget must be"):
            lazy_mlir.init("O1", memory_budget=bad)
    lazy_mlir.init("O1")


@pytest.mark.parametrize("name", ["gpt2", pytest.param("bert", marks=pytest.mark.slow)])
def test_hugging_face_models_checkpoint_their_layers(name):
    """Models nobody here wrote (the zoo's base size: 4 layers, dropout off),
    float64: their layers found, checkpointed and recomputed, as eagerly."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
    import zoo
    variant = zoo.base_variant(name, dropout=0.0, size="base")
    batches = zoo.batches(variant, 6, dtype=torch.float64)[:6]
    spec = zoo.SPECS[name]

    def make():
        return zoo.make_model(variant, dtype=torch.float64).train()
    eager = train(make, spec.optimizer, batches, CPU, spec.loss)
    lazy_mlir.init("O1", memory_budget=1 << 20)
    try:
        metrics.reset()
        with pytest.warns(UserWarning, match="memory_budget"):
            lazy = train(make, spec.optimizer, batches, LAZY, spec.loss)
        s = metrics.snapshot()
    finally:
        lazy_mlir.init("O1")
    assert_same_training(eager, lazy, rtol=1e-10, atol=1e-10)
    assert_compiled(s, calls=len(batches))
    (model,) = s["memory_budget"]["partitions"]
    assert model["blocks"] == zoo.SIZES["base"].layers and model[1.0]["recomputed_ops"] > 0, model
    assert s["captured_calls"] == len(batches), metrics.report()
