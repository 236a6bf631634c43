"""Tied parameters stay tied on the lazy device (GPT's wte / lm_head)."""
import torch

from lazy_mlir.models import make_gpt
from helpers import LAZY, SMALL_GPT


def test_to_lazy_keeps_tied_parameters(lazy_level):
    model = make_gpt(SMALL_GPT)
    n_before = len(list(model.parameters()))
    model = model.to(LAZY)
    assert model.lm_head.weight is model.wte.weight
    assert len(list(model.parameters())) == n_before
    assert model.wte.weight.device.type == "lazy"


def test_untied_modules_are_unchanged(lazy_level):
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    seq = torch.nn.Sequential(a, b).to(LAZY)
    assert seq[0].weight is not seq[1].weight
