"""Random draws on the lazy device take eager's numbers: same seed, same masks.

Random ops stay in the TorchScript glue graph and draw from the default
generator when it runs, one after another. LTC lowers a graph in post-order
from its outputs, which visits an add's second operand first: without
draw_order.h, the two dropouts below would swap masks (same distribution,
silently other numbers than eager's).
"""
import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir import metrics
from helpers import LAZY, assert_compiled

CPU = torch.device("cpu")


def independent_branches(device, n):
    """Three draws: the second depends on compiled code after the first, the
    third on neither; the output reads the third before the second."""
    torch.manual_seed(0)
    a = torch.linspace(1, 2, n).to(device)
    b = torch.linspace(3, 4, n).to(device)
    first = F.dropout(torch.relu(a), 0.5)
    second = F.dropout(first * 2 + 1, 0.5)
    third = F.dropout(b, 0.5)
    out = second + third * 3
    del first, second, third  # not step outputs: only `out` roots the graph
    if device.type == "lazy":
        torch._lazy.mark_step()
    return out.cpu()


@pytest.mark.parametrize("level, options", [("O0", {}), ("O1", {}), ("O1", {"source_lines": False})],
                         ids=["O0", "O1", "O1-no-source-lines"])
def test_draws_match_eager(level, options):
    n = 37 + len(options) + 2 * (level == "O0")  # a graph of its own per case (LTC caches by structure)
    lazy_mlir.init(level, **options)
    try:
        metrics.reset()
        eager = independent_branches(CPU, n)
        lazy = independent_branches(LAZY, n)
        s = metrics.snapshot()
    finally:
        lazy_mlir.init("O1")
    assert torch.equal(lazy, eager), (lazy, eager)
    assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()
    if level == "O1":
        # the groups around the draws ran generated code: the clusterer kept
        # the draws in order without merging across them
        assert_compiled(s, calls=2)


def test_draws_also_differ_from_each_other():
    """The check above would pass if every draw used the same mask."""
    torch.manual_seed(0)
    masks = [F.dropout(torch.ones(64), 0.5) for _ in range(3)]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


def every_kind_of_draw(device):
    """Each random op a training step is likely to trace, beside compiled ops."""
    torch.manual_seed(3)
    x = torch.linspace(-1, 1, 41).to(device)
    out = [F.dropout(x.exp(), 0.3), torch.rand_like(x) * 2, torch.randn_like(x) + x,
           torch.bernoulli(torch.full_like(x, 0.4)), torch.empty_like(x).uniform_(-2, 2) - x,
           torch.empty_like(x).normal_(1.0, 3.0) * x, torch.rand(41, device=device), torch.randn(41, device=device)]
    if device.type == "lazy":
        torch._lazy.mark_step()
    return torch.stack([o.cpu() for o in out])


def test_every_kind_of_draw_matches_eager(lazy_level):
    # randn and normal_ trace as aten::normal_functional: once missing from
    # RANDOM_OPS, they compiled into a group and drew Inductor's numbers
    eager = every_kind_of_draw(CPU)
    lazy = every_kind_of_draw(LAZY)
    torch.testing.assert_close(lazy, eager, rtol=1e-6, atol=1e-6)
    assert_compiled()
