"""Randomized chains of view, index and broadcast ops on one tensor, and its
gradient, float64, the lazy device at O1 against eager (property-based,
hypothesis).

fold-copy-ops turns the functionalized copies of views into views, and
Inductor folds views into the index arithmetic of what reads them: the
class of graphs where the multi-query miscompile hid (a scatter, the
backward of a list index, fed by a transposed view). Each example draws a
chain (transpose, permute, slice with steps, select, narrow, unsqueeze,
expand, reshape, list indexing with negative indices, flip, a broadcast
product with a parameter), reads its result in two ways, and compares the
value and both gradients. ``make test`` runs a few fixed examples; the
sweep (``pytest tests/test_view_chains.py -m sweep``) runs 150.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazy_mlir
from helpers import CPU, LAZY, assert_compiled
from lazy_mlir.observe import metrics

BASE = (4, 6, 5)


@st.composite
def chains(draw):
    """A list of (op, arguments), valid for the shapes they meet."""
    shape, steps = list(BASE), []
    for _ in range(draw(st.integers(2, 7))):
        ndim = len(shape)
        choices = ["transpose", "permute", "slice", "unsqueeze", "flip", "scale"]
        if ndim > 1:
            choices += ["select", "reshape_merge"]
        if any(n > 1 for n in shape):
            choices += ["index_list", "narrow"]
        if 1 in shape:
            choices += ["expand"]
        if ndim < 5:
            choices += ["unsqueeze"]
        op = draw(st.sampled_from(choices))
        dim = draw(st.integers(0, ndim - 1))
        if op == "transpose":
            steps.append((op, (dim, draw(st.integers(0, ndim - 1)))))
            a, b = steps[-1][1]
            shape[a], shape[b] = shape[b], shape[a]
        elif op == "permute":
            perm = draw(st.permutations(range(ndim)))
            steps.append((op, (tuple(perm),)))
            shape = [shape[p] for p in perm]
        elif op == "slice":
            start = draw(st.integers(0, shape[dim] - 1))
            step = draw(st.integers(1, 2))
            steps.append((op, (dim, start, step)))
            shape[dim] = len(range(start, shape[dim], step))
        elif op == "select":
            steps.append((op, (dim, draw(st.integers(-shape[dim], shape[dim] - 1)))))
            del shape[dim]
        elif op == "narrow":
            dim = draw(st.sampled_from([d for d, n in enumerate(shape) if n > 1]))
            start = draw(st.integers(0, shape[dim] - 2))
            length = draw(st.integers(1, shape[dim] - start))
            steps.append((op, (dim, start, length)))
            shape[dim] = length
        elif op == "unsqueeze":
            dim = draw(st.integers(0, ndim))
            steps.append((op, (dim,)))
            shape.insert(dim, 1)
        elif op == "expand":
            dim = draw(st.sampled_from([d for d, n in enumerate(shape) if n == 1]))
            size = draw(st.integers(2, 3))
            steps.append((op, (dim, size)))
            shape[dim] = size
        elif op == "reshape_merge":
            dim = draw(st.integers(0, ndim - 2))
            steps.append((op, (dim,)))
            shape[dim:dim + 2] = [shape[dim] * shape[dim + 1]]
        elif op == "index_list":
            dim = draw(st.sampled_from([d for d, n in enumerate(shape) if n > 1]))
            n = shape[dim]
            picks = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))
            steps.append((op, (dim, tuple(picks))))
            shape[dim] = len(picks)
        elif op == "flip":
            steps.append((op, (dim,)))
        elif op == "scale":  # a broadcast product with the parameter: its gradient sums over the chain
            steps.append((op, (dim,)))
    return steps


def run_chain(steps, x, w):
    y = x
    for op, args in steps:
        if op == "transpose":
            y = y.transpose(*args)
        elif op == "permute":
            y = y.permute(*args[0])
        elif op == "slice":
            dim, start, step = args
            y = y[(slice(None),) * dim + (slice(start, None, step),)]
        elif op == "select":
            y = y.select(*args)
        elif op == "narrow":
            y = y.narrow(*args)
        elif op == "unsqueeze":
            y = y.unsqueeze(*args)
        elif op == "expand":
            dim, size = args
            sizes = [-1] * y.dim()
            sizes[dim] = size
            y = y.expand(*sizes)
        elif op == "reshape_merge":
            dim = args[0]
            y = y.reshape(*y.shape[:dim], y.shape[dim] * y.shape[dim + 1], *y.shape[dim + 2:])
        elif op == "index_list":
            dim, picks = args
            y = y[(slice(None),) * dim + (list(picks),)]
        elif op == "flip":
            y = y.flip(args[0])
        elif op == "scale":
            dim = args[0]
            factor = w[: y.shape[dim]].reshape([-1 if d == dim else 1 for d in range(y.dim())])
            y = y * factor
    return y


def step(steps, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BASE, generator=g, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(8, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = run_chain(steps, x, w)
    weights = torch.randn(tuple(y.shape), generator=g, dtype=torch.float64).to(device)
    # two readers of the chain's result: an elementwise product and a reduction over its last dim
    loss = (y * weights).sum() + (y.sum(-1) ** 2).sum() if y.dim() else y * 3
    loss.backward()
    if device.type == "lazy":
        torch._lazy.mark_step()
    grads = [t if t is not None else torch.zeros(()) for t in (x.grad, w.grad)]  # w: read by scale steps only
    return [t.detach().cpu() for t in (loss, *grads)]


def check(steps):
    eager = step(steps, CPU, seed=len(steps))
    metrics.reset()
    lazy = step(steps, LAZY, seed=len(steps))
    assert_compiled()
    for got, want, what in zip(lazy, eager, ("loss", "x.grad", "w.grad")):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{what} of {steps}")


@pytest.fixture(scope="module", autouse=True)
def lazy_o1():
    lazy_mlir.init("O1")
    yield


_SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
                 database=None)


@settings(max_examples=5, **_SETTINGS)
@given(chains())
def test_view_chains_match_eager(steps):
    check(steps)


def test_the_multi_query_shape_matches_eager():
    """The chain of the miscompile: a list index with a negative index, a
    transpose, a broadcast (its backward: a scatter fed by a transposed value)."""
    check([("index_list", (1, (-2,))), ("transpose", (0, 2)), ("expand", (1, 3)), ("scale", (2,))])


@pytest.mark.sweep
@settings(max_examples=150, **_SETTINGS)
@given(chains())
def test_view_chains_sweep(steps):
    check(steps)
