"""Random draws on the lazy device take eager's numbers: same seed, same masks.

Random ops stay in the TorchScript glue graph and draw from the default
generator when it runs, one after another. LTC lowers a graph in post-order
from its outputs, which visits an add's second operand first: without
draw_order.h, the two dropouts below would swap masks (same distribution,
silently other numbers than eager's).
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics
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
@pytest.mark.compiles_in_step("checks each step's draws came from generated code, the first step's too")
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
        # the masks are drawn in order in the glue, and the compute around
        # them (which reads them) is one group of generated code after them
        # (lazy_backend/ltc_fixes/dropout_masks.h)
        assert s["groups_built"] == 1, metrics.report()
        assert_compiled(s, calls=1)


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


@pytest.mark.compiles_in_step("checks each step's draws came from generated code, the first step's too")
def test_every_kind_of_draw_matches_eager(lazy_level):
    # randn and normal_ trace as aten::normal_functional: once missing from
    # RANDOM_OPS, they compiled into a group and drew Inductor's numbers
    eager = every_kind_of_draw(CPU)
    lazy = every_kind_of_draw(LAZY)
    torch.testing.assert_close(lazy, eager, rtol=1e-6, atol=1e-6)
    assert_compiled()


def sampling_draws(device):
    """Sampling ops among traced draws, one of them unused: in eager's order."""
    torch.manual_seed(3)
    mean, std = torch.arange(6.0).to(device), torch.full((6,), 0.5).to(device)
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]).to(device)
    drawn = [torch.normal(mean, std), torch.poisson(mean + 1), torch.multinomial(probs, 2)]
    unused = torch.poisson(mean)  # nothing reads it: it draws all the same
    del unused
    drawn += [torch.rand(3, device=device), torch.normal(mean, 2.0), torch.binomial(mean, torch.full((6,), 0.5).to(device)),
              torch._standard_gamma(mean + 1), torch.normal(1.0, std), torch._sample_dirichlet(probs)]
    if device.type == "lazy":
        torch._lazy.mark_step()
    return [t.cpu() for t in drawn]


def test_sampling_ops_draw_in_the_step_in_eagers_order(lazy_level):
    """normal with tensor moments, poisson, multinomial, binomial and gamma
    are traced (lazy_kernels: a random op in the glue, compilable.RANDOM_OPS):
    run eagerly on the host they drew at once, ahead of traced draws made
    before them, and the numbers differed from eager's."""
    eager = sampling_draws(CPU)
    metrics.reset()
    lazy = sampling_draws(LAZY)
    s = metrics.snapshot()
    for got, want in zip(lazy, eager):
        assert torch.equal(got, want), (got, want)
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()


def in_place_draws(device):
    """In-place draws (Gumbel-softmax's exponential_, timm-style masks by
    bernoulli_ with tensor probabilities, RReLU's noise) and randperm (a
    factory) among traced draws, one unused, and RReLU's gradient (its noise)."""
    torch.manual_seed(11)
    x = torch.linspace(-2, 2, 24, dtype=torch.float64).reshape(4, 6).to(device).requires_grad_()
    drawn = [F.dropout(x, 0.5), torch.empty_like(x).exponential_(), F.gumbel_softmax(x, tau=0.5),
             torch.empty_like(x).cauchy_(), torch.empty_like(x).geometric_(0.3)]
    unused = torch.empty_like(x).log_normal_()
    del unused  # draws all the same, as eagerly
    rrelu = F.rrelu(x, training=True)
    drawn += [torch.empty_like(x).bernoulli_(torch.full_like(x, 0.3)), torch.empty_like(x).log_normal_(0.5, 0.2),
              rrelu, torch.rand_like(x), x.flatten()[torch.randperm(24, device=x.device)],
              torch.randperm(7, dtype=torch.float64, device=device)]
    (grad,) = torch.autograd.grad(rrelu.sum(), x)
    drawn.append(grad)
    if device.type == "lazy":
        torch._lazy.mark_step()
    return [t.detach().cpu() for t in drawn]


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_in_place_draws_trace_in_eagers_order(lazy_level):
    """exponential_, cauchy_, geometric_, log_normal_, bernoulli_ with a
    tensor, RReLU's noise and randperm ran eagerly (LTC's fallback): drawn
    at once, ahead of the traced draws before them, they took other numbers
    than eager's. Each is now a sampling op traced in order (in-place ones
    as their functional sibling)."""
    eager = in_place_draws(CPU)
    metrics.reset()
    lazy = in_place_draws(LAZY)
    s = metrics.snapshot()
    for got, want in zip(lazy, eager):  # float64: other numbers would differ by far more
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()


def reseeded_mid_step(device, host_draw_at):
    """Two dropouts; the host's generator used ``before`` the first, ``between``
    them (a reseed, a host draw) or ``after`` mark_step."""
    torch.manual_seed(0)
    x = torch.ones(32, dtype=torch.float64).to(device)
    if host_draw_at == "before":
        torch.randint(0, 9, (4,))
    first = F.dropout(x, 0.5)
    if host_draw_at == "between":
        torch.manual_seed(1)
        torch.rand(3)
    second = F.dropout(x * 2, 0.5)
    if device.type == "lazy":
        torch._lazy.mark_step()
    if host_draw_at == "after":
        torch.rand(3)
    return first.cpu(), second.cpu()


@pytest.mark.parametrize("host_draw_at", ["before", "between", "after"])
def test_a_host_use_of_the_generator_mid_step_is_reported(lazy_level, host_draw_at):
    """Lazy draws take their numbers when the step runs. A reseed or a host
    draw between two of them gives the step other numbers than eager's
    (silently, before host_generator.h): it is counted and warned about.
    Host draws before the step's first draw or after mark_step are eager's
    order, and say nothing."""
    eager = reseeded_mid_step(CPU, host_draw_at)
    metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lazy = reseeded_mid_step(LAZY, host_draw_at)
    s = metrics.snapshot()
    warned = [w for w in caught if "the host used after the step's first draw" in str(w.message)]
    matches = all(torch.equal(a, b) for a, b in zip(lazy, eager))
    if host_draw_at == "between":
        assert not matches  # what the report is about
        assert s["draws_after_host_use"] == 1 and len(warned) == 1, [str(w.message) for w in caught]
        assert warned[0].filename == __file__
    else:
        assert matches
        assert s["draws_after_host_use"] == 0 and not warned, [str(w.message) for w in caught]


def test_a_host_draw_after_a_captured_forward_is_reported(lazy_level):
    """A captured forward's dropout is a draw of its region node: a batch
    sampled on the host after that forward (nanoGPT's order) is reported
    too; the batch made before the forward is not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)).to(LAZY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(3):
            loss = model(torch.randn(4, 8).to(LAZY)).sum()
            if step == 2:
                torch.randint(0, 10, (2,))
            loss.backward()
            torch._lazy.mark_step()
    s = metrics.snapshot()
    assert s["captured_calls"] >= 2 and s["draws_after_host_use"] == 1, metrics.report()


def test_a_failed_steps_draws_leave_the_next_step_quiet(lazy_level):
    """A step that fails (O2: its dropout cannot compile) never ran its draws:
    the next step compares the generator with its own first draw's state,
    not the failed step's (a reseed between the two steps is no mid-step use)."""
    lazy_mlir.init("O2")
    x = torch.ones(8).to(LAZY)
    failed = F.dropout(x, 0.5).sum()
    with pytest.raises(RuntimeError, match="cannot be compiled"):
        torch._lazy.mark_step()
    del failed
    lazy_mlir.init("O1")
    metrics.reset()
    torch.manual_seed(0)
    out = F.dropout(x * 2, 0.5)
    torch._lazy.mark_step()
    assert torch.isfinite(out.cpu()).all()
    assert metrics.snapshot()["draws_after_host_use"] == 0, metrics.report()


def test_a_sampling_op_with_its_own_generator_draws_at_once(lazy_level):
    """Draws from a generator of the user's are that generator's, in the
    order the user makes them: the eager path, counted."""
    def draws(device):
        g = torch.Generator().manual_seed(7)
        mean = torch.arange(4.0).to(device)
        out = [torch.normal(mean, torch.ones(4).to(device), generator=g), torch.poisson(mean, generator=g),
               torch.randn(4, generator=g).to(device)]
        if device.type == "lazy":
            torch._lazy.mark_step()
        return [t.cpu() for t in out]

    eager = draws(CPU)
    metrics.reset()
    lazy = draws(LAZY)
    assert all(torch.equal(a, b) for a, b in zip(lazy, eager))
    assert metrics.snapshot()["fallbacks"] == {"aten::normal.Tensor_Tensor": 1, "aten::poisson": 1}


def unused_draws(device, n, read_mid_step=False):
    """A dropout whose output nothing reads between two that are read: eager
    runs all three, so the third's mask follows the second's numbers. With
    ``read_mid_step``, the loss is read before the third draw (value_reads.h
    syncs the whole step then, the unused draw with it)."""
    torch.manual_seed(5)
    x = torch.linspace(-1, 1, n).to(device)
    first = F.dropout(x.exp(), 0.5)
    unused = F.dropout(first * 3, 0.5)
    del unused  # as a model's branch that no loss reads
    second = F.dropout(torch.tanh(first), 0.5)
    read = (second * 2).sum().item() if read_mid_step else None
    third = F.dropout(x.sin() + second, 0.5)
    if device.type == "lazy":
        torch._lazy.mark_step()
    return third.cpu(), read


@pytest.mark.parametrize("read_mid_step", [False, True], ids=["one-sync", "read-mid-step"])
def test_an_unused_draw_still_draws(lazy_level, read_mid_step):
    n = 43 + read_mid_step
    eager = unused_draws(CPU, n, read_mid_step)
    metrics.reset()
    lazy = unused_draws(LAZY, n, read_mid_step)
    s = metrics.snapshot()
    assert torch.equal(lazy[0] == 0, eager[0] == 0), (lazy, eager)  # the mask
    # the generated exp, tanh and sin may differ from eager's in the last bit
    torch.testing.assert_close(lazy[0], eager[0], rtol=1e-6, atol=1e-6)
    if read_mid_step:
        assert lazy[1] == pytest.approx(eager[1], rel=1e-6)
    # drawn once: at the read's sync, not again at mark_step
    assert s["dead_draws_kept"] == 1, metrics.report()
    assert s["graph_executions"] == 1 + read_mid_step and s["fallback_count"] == 0, metrics.report()
    assert_compiled(s, calls=1 + read_mid_step)  # a group after the masks, a graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_glue_mask_draw_is_native_dropouts(dtype):
    """lazy_mlir::dropout_mask (lazy_backend/ltc_fixes/dropout_masks.h) draws
    native_dropout's mask for a tensor of that size, and `x * mask * scale`
    is native_dropout's output to the bit."""
    x = torch.randn(7, 129, dtype=torch.float64).to(dtype)
    torch.manual_seed(11)
    out, mask = torch.native_dropout(x, 0.3, True)
    torch.manual_seed(11)
    drawn = torch.ops.lazy_mlir.dropout_mask(list(x.shape), dtype, 0.3, torch.device("cpu"))
    assert drawn.dtype == mask.dtype and torch.equal(drawn, mask)
    product = x * drawn * (1.0 / (1.0 - 0.3))
    if dtype == torch.bfloat16:
        # aten's CPU kernel rounds mask * scale to bfloat16 first (CUDA's
        # does not): one rounding apart
        torch.testing.assert_close(product, out, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(product, out)


@pytest.mark.parametrize("captured", [False, True], ids=["traced", "captured"])
def test_a_dropout_in_the_glue_does_not_cut_the_step(captured):
    """With eager's masks each dropout runs in the glue; split from its
    product, only the mask draw is there, and the step (forward, backward,
    update) is one group of generated code with eager's masks. The same
    for a captured model (its region records the dropout's sizes)."""
    lazy_mlir.init("O1", capture="auto" if captured else "off")

    def train(device):
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.GELU(), torch.nn.Dropout(0.25),
                                    torch.nn.Linear(32, 32), torch.nn.Dropout(0.25), torch.nn.Linear(32, 1))
        model = model.double().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = lazy_mlir.capture(model) if captured and device.type == "lazy" else model
        x = torch.linspace(-2, 2, 16 * 24, dtype=torch.float64).reshape(16, 24).to(device)
        for _ in range(2):
            loss = forward(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device.type == "lazy":
                torch._lazy.mark_step()
        return [p.detach().cpu() for p in model.parameters()]

    eager = train(CPU)
    metrics.reset()
    lazy = train(LAZY)
    s = metrics.snapshot()
    for a, b in zip(lazy, eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert s["groups_built"] == 1 and s["graph_executions"] == 2, metrics.report()
    assert s["captured_calls"] == (2 if captured else 0), metrics.report()
    assert_compiled(s, calls=2)


class _UnusedDraw(torch.nn.Module):
    """A forward that draws numbers nothing reads (eagerly the generator
    still moves on), then a dropout whose mask depends on where it is."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.a, self.b = kind, torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if self.kind == "dropout":
            F.dropout(h, 0.5)
        elif self.kind == "rand_like":
            torch.rand_like(h)
        else:
            torch.bernoulli(torch.full_like(h, 0.5))
        return self.b(F.dropout(h, 0.3)).square().mean()


def _train_with_an_unused_draw(kind, device, steps=3):
    """(losses, parameters, whether the batch kept on the device is intact)."""
    torch.manual_seed(0)
    model = _UnusedDraw(kind).double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(4, 8)
    x = batch.to(device)  # moved once, read by every step
    torch.manual_seed(5)
    losses = []
    for _ in range(steps):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazy":
            torch._lazy.mark_step()
        losses.append(loss.item())
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return torch.tensor(losses, dtype=torch.float64), params, torch.equal(x.cpu(), batch)


@pytest.mark.parametrize("kind", ["dropout", "rand_like", "bernoulli"])
@pytest.mark.parametrize("capture", ["off", "auto"], ids=["traced", "captured"])
@pytest.mark.compiles_in_step("each step's draws come from generated code, the first step's too")
def test_an_unused_draw_in_a_training_step_draws_as_in_eager(kind, capture):
    """Traced op by op, the unused draw is a dead draw synced at mark_step;
    its place among the draws is restored when the graph is lowered, and
    that lowering must not count the graph's inputs twice (it did: buffer
    donation then wrote the unused dropout's result into the batch on the
    device at the first step). Captured, the recorded forward keeps the
    draw as a region output of its own (its region dropped it: every later
    mask differed from eager's, and an unused dropout refused the record).
    Float64, against eager and O0 on the same inputs."""
    eager_losses, eager_params, _ = _train_with_an_unused_draw(kind, CPU)
    runs = {}
    for level in ("O0", "O1"):
        lazy_mlir.init(level, capture=capture)
        lazy_mlir.native._C.clear_computation_cache()  # the first step lowers its graph, as in a new process
        metrics.reset()
        try:
            losses, params, intact = _train_with_an_unused_draw(kind, LAZY)
        finally:
            lazy_mlir.init("O1")
        s = metrics.snapshot()
        assert intact, f"{level}: the batch on the device was overwritten"
        torch.testing.assert_close(losses, eager_losses, rtol=1e-12, atol=0, msg=level)
        for name, p in eager_params.items():
            torch.testing.assert_close(params[name], p, rtol=1e-12, atol=1e-14, msg=f"{level} {name}")
        assert s["dead_draws_kept"] == 3 and s["graph_executions"] == 3, metrics.report()
        if capture == "auto":
            assert s["captured_calls"] == 3 and s["capture_refused"] == 0, metrics.report()
        if level == "O1":
            assert_compiled(s, calls=3)
        runs[level] = losses, params
    torch.testing.assert_close(runs["O1"][0], runs["O0"][0], rtol=1e-12, atol=0)
    for name, p in runs["O0"][1].items():
        torch.testing.assert_close(runs["O1"][1][name], p, rtol=1e-12, atol=1e-14, msg=name)
