"""Training on the lazy device gives eager PyTorch's numbers (fp32, rtol 1e-5)."""
import pytest
import torch

from helpers import (LAZY, assert_same_training, make_adamw, make_mlp, mlp_batches, sgd, small_gpt,
                      small_gpt_batches, train)

CPU = torch.device("cpu")


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_mlp_sgd_matches_eager(lazy_level):
    batches = mlp_batches()
    assert_same_training(train(make_mlp, sgd, batches, CPU), train(make_mlp, sgd, batches, LAZY))


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_gpt_adamw_matches_eager(lazy_level):
    batches = small_gpt_batches()
    eager = train(small_gpt, make_adamw, batches, CPU)
    assert_same_training(eager, train(small_gpt, make_adamw, batches, LAZY))
