"""The bound on the loads Inductor traces per element (codegen/inlining_bound).

A chain whose links each read the previous link twice (Adam's ``lerp`` as
Inductor decomposes it) doubles Inductor's tracing at each link. The pass
realizes links so that no value's tree exceeds the bound, leaves graphs of
ordinary steps unchanged, and the code computes the same numbers; a view
read by the chain is cut at the value behind it (an expanded view itself
Inductor cannot store). On the lazy device, AdamW steps chained before one
``mark_step`` train as eagerly and as at O0 (12 of them on a 4-parameter
MLP took 283 s to compile without the bound, 28 s with it)."""
import functools

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import lazy_mlir
from lazy_mlir.codegen import inductor, inlining_bound
from lazy_mlir.observe import metrics
from helpers import CPU, LAZY, assert_compiled

LINKS = 16  # 2^16 loads of the first ``m`` unbounded
COMPILED_LINKS = 10  # over the bound, and compiled in seconds without it: the test fails, not hangs


def _lerp_chain(m, g, links=LINKS):
    """Adam's first moment over ``links`` steps, as Inductor decomposes lerp: each link reads ``m`` twice."""
    for _ in range(links):
        m = m + 0.1 * (g - m)
    return (m,)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4, 8, dtype=torch.float64, generator=gen) for _ in range(2)]


def test_a_chain_read_twice_per_link_is_realized_within_the_bound():
    gm = make_fx(functools.partial(_lerp_chain, links=LINKS))(*_inputs())
    realized = inlining_bound.bound(gm.graph)
    assert realized > 0
    stored = [n for n in gm.graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default]
    assert len(stored) == realized
    assert inlining_bound.bound(gm.graph) == 0  # every value within the bound now
    gm.recompile()
    torch.testing.assert_close(gm(*_inputs()), _lerp_chain(*_inputs()), rtol=1e-14, atol=0)


def _views_chain(m, g, links=LINKS):
    """Each link adds two views of the previous one, read directly: a
    transpose, and an expanded column and row (a layout no buffer has)."""
    for i in range(links):
        a, b = (m[:, :1].expand(4, 4), m[:1, :].expand(4, 4)) if i % 2 else (m.t(), m.t())
        m = torch.add(a, b) + g
    return (m,)


def _square_inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4, 4, dtype=torch.float64, generator=gen) for _ in range(2)]


@pytest.mark.parametrize("chain, inputs", [(_lerp_chain, _inputs), (_views_chain, _square_inputs)],
                         ids=["lerp", "views"])
def test_the_compiled_chain_is_bounded_inside_inductor_and_computes_eagers_numbers(chain, inputs, monkeypatch):
    chain = functools.partial(chain, links=COMPILED_LINKS)
    realized = []
    bound = inlining_bound.bound
    monkeypatch.setattr(inlining_bound, "bound", lambda graph: realized.append(bound(graph)) or realized[-1])
    gm = make_fx(chain)(*inputs())
    fake_mode = FakeTensorMode()
    with torch._inductor.config.patch(fx_graph_cache=False):  # Inductor's passes run, not its cached code
        run, _, _ = inductor.compile_graph(gm, [fake_mode.from_tensor(t) for t in inputs()], fake_mode,
                                           "inlining_bound_test")
    assert sum(realized) > 0  # by our post-grad pass, in Inductor's compile
    torch.testing.assert_close(run(inputs()), list(chain(*inputs())), rtol=1e-12, atol=0)


def test_an_attention_step_is_left_as_it_is():
    def step(x, w):
        b, t, c = x.shape
        q, k, v = (x @ w).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, 2, c // 2).transpose(1, 2) for z in (q, k, v))
        y = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        loss = nn.functional.gelu(y.transpose(1, 2).reshape(b, t, c) @ w[:, :c]).square().sum()
        return (loss, *torch.autograd.grad(loss, [x, w]))

    g = torch.Generator().manual_seed(0)
    gm = make_fx(step, decomposition_table=torch._inductor.decomposition.select_decomp_table())(
        torch.randn(2, 8, 32, generator=g).requires_grad_(), torch.randn(32, 96, generator=g).requires_grad_())
    assert inlining_bound.bound(gm.graph) == 0


def _chained_adamw(device, steps):
    """``steps`` AdamW updates on one gradient before one mark_step: the parameters after."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4, dtype=torch.float64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(torch.randn(16, 8, dtype=torch.float64).to(device)).square().mean()
    loss.backward()
    for _ in range(steps):
        opt.step()
    if device.type == "lazy":
        torch._lazy.mark_step()
    with torch.no_grad():
        return {n: p.cpu() for n, p in model.named_parameters()}


def test_adamw_steps_chained_before_one_mark_step_train_as_eagerly_and_as_at_o0():
    eager = _chained_adamw(CPU, 12)
    try:
        for level in ("O0", "O1"):
            lazy_mlir.init(level, cache=False)
            metrics.reset()
            lazy = _chained_adamw(LAZY, 12)
            if level == "O1":
                assert_compiled()
            for name in eager:
                torch.testing.assert_close(lazy[name], eager[name], rtol=1e-12, atol=1e-14, msg=f"{level} {name}")
    finally:
        lazy_mlir.init("O1")
