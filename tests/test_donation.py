"""Buffer donation: parameters and optimizer state that a step overwrites are
written by the generated code into their own storage (lazy_mlir.codegen.donation,
lazy_backend/memory/buffer_donation.h), training matches eager, and a buffer that
anything else can still read is never overwritten."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.cache import compile_cache
from lazy_mlir.compile import shape_generic
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics

from helpers import LAZY, SMALL_GPT, assert_compiled, gpt_batches, make_gpt

_COUNTERS = ("outputs_in_place", "in_place_bytes", "donor_copies", "group_outputs")


@pytest.fixture(params=[True], ids=["donate"])
def donation(request):
    lazy_mlir.init("O1", donate_buffers=request.param)
    metrics.reset()
    shape_generic.clear()
    compile_cache.forget_failures()
    yield request.param
    lazy_mlir.init("O1")


def _counters():
    s = _C.stats()
    return {k: s[k] for k in _COUNTERS}


def _state(model, opt):
    """Parameters and AdamW moments, by name."""
    named = dict(model.named_parameters())
    out = dict(named)
    for name, p in named.items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in opt.state.get(p, {}):
                out[f"{name}.{key}"] = opt.state[p][key]
    return out


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def test_gpt_adamw_updates_state_in_place(donation):
    """GPT (tied embeddings: one parameter in two modules; every Linear weight
    read twice, by the forward and by its update) with AdamW in fp64: once
    steady (the steps that compile hold their tensors a little longer, and
    those buffers are copied, not overwritten) every parameter and moment
    keeps its buffer, nothing is copied, and training matches eager. Steady
    from the second step: the first step's run through Python (Inductor's
    alias checks ask for storages) leaves no copy behind."""
    batches = list(gpt_batches(SMALL_GPT, 7))

    def run(device):
        model = make_gpt(SMALL_GPT).double().to(device)
        opt = _adamw(model)
        losses, buffers = [], []
        for x, y in batches:
            loss = model(x.to(device), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device == LAZY:
                torch._lazy.mark_step()
                buffers.append({n: _C.device_data_ptr(t) for n, t in _state(model, opt).items()})
                counters.append(_counters())
            losses.append(loss.item())
        with torch.no_grad():
            return losses, {n: t.cpu() for n, t in _state(model, opt).items()}, buffers

    eager_losses, eager_state, _ = run(torch.device("cpu"))
    counters = []
    losses, state, buffers = run(LAZY)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-10, atol=1e-12)
    assert state.keys() == eager_state.keys()
    for name in state:
        torch.testing.assert_close(state[name], eager_state[name], rtol=1e-10, atol=1e-12, msg=name)
    assert_compiled(calls=len(batches))
    assert len(buffers[-1]) == 3 * len(list(make_gpt(SMALL_GPT).parameters()))
    for i in range(2, len(buffers)):
        moved = [n for n in buffers[i] if buffers[i][n] != buffers[i - 1][n] or buffers[i][n] == 0]
        assert moved == [], f"step {i}: fresh buffers for {moved}"
    steady = [counters[i] for i in (0, -1)]
    assert steady[1]["outputs_in_place"] - steady[0]["outputs_in_place"] >= (len(batches) - 1) * len(buffers[-1])
    assert steady[1]["donor_copies"] == steady[0]["donor_copies"]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


def _net_batches(steps=5):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
            for _ in range(steps)]


def test_references_taken_before_a_step_keep_their_values():
    """Before each step: a clone of a parameter and a clone of a moment, kept
    until after the step, which overwrites their sources in place. Every
    value read matches the same loop without donation exactly (which is the
    reference here: that loop itself differs from eager on this pattern,
    with or without donation: a difference of its own, left for later)."""
    batches = _net_batches()

    def run(donate):
        lazy_mlir.init("O1", donate_buffers=donate)
        torch.manual_seed(0)
        model = _Net().double().to(LAZY)
        opt = _adamw(model)
        seen, buffers = [], []
        for x, y in batches:
            w = model.fc1.weight
            old = w.clone()
            moment = opt.state[w]["exp_avg"].clone() if w in opt.state else None
            model(x.to(LAZY), y.to(LAZY)).backward()
            opt.step()
            opt.zero_grad()
            torch._lazy.mark_step()
            buffers.append(_C.device_data_ptr(model.fc2.weight))
            with torch.no_grad():
                seen.append([old.cpu(), w.cpu()] + ([moment.cpu()] if moment is not None else []))
        return seen, buffers

    try:
        reference, _ = run(False)
        before = _counters()
        donated, buffers = run(True)
        after = _counters()
    finally:
        lazy_mlir.init("O1")
    for step, (e, z) in enumerate(zip(reference, donated)):
        assert len(e) == len(z)
        for k, (a, b) in enumerate(zip(e, z)):
            assert torch.equal(a, b), f"step {step}, tensor {k}"
    assert after["outputs_in_place"] > before["outputs_in_place"]
    assert buffers[-1] == buffers[-2]  # fc2.weight, not referenced, is updated in place


def test_live_input_of_the_same_shape_is_copied_not_overwritten(donation):
    """``s = 0.5 * s + a`` with ``a`` kept by the user: ``a`` is the input
    nearest to the new ``s`` (one op away), so the group writes the new value
    into ``a``'s buffer, but ``a`` is alive after the step: the backend hands
    the code a copy instead, and ``a`` keeps its value."""
    a_cpu = torch.arange(4096, dtype=torch.float64).reshape(64, 64)
    a = a_cpu.to(LAZY)
    s = torch.zeros(64, 64, dtype=torch.float64).to(LAZY)
    s_eager = torch.zeros(64, 64, dtype=torch.float64)
    before = _counters()
    for _ in range(4):
        s.mul_(0.5).add_(a)
        torch._lazy.mark_step()
        s_eager.mul_(0.5).add_(a_cpu)
    after = _counters()
    assert torch.equal(a.cpu(), a_cpu)
    torch.testing.assert_close(s.cpu(), s_eager, rtol=0, atol=0)
    assert after["donor_copies"] > before["donor_copies"]  # the protection ran


def test_donation_off_returns_fresh_buffers():
    """With donate_buffers=False the same loop allocates every new value (so
    the tests above see donation, not an allocator that happens to reuse)."""
    lazy_mlir.init("O1", donate_buffers=False)
    metrics.reset()
    try:
        torch.manual_seed(0)
        model = _Net().double().to(LAZY)
        opt = _adamw(model)
        before = _counters()
        buffers = []
        for x, y in _net_batches(4):
            model(x.to(LAZY), y.to(LAZY)).backward()
            opt.step()
            opt.zero_grad()
            torch._lazy.mark_step()
            buffers.append(_C.device_data_ptr(model.fc1.weight))
        after = _counters()
        assert all(b != c for b, c in zip(buffers[1:], buffers[2:]))
        assert after["outputs_in_place"] == before["outputs_in_place"]
    finally:
        lazy_mlir.init("O1")


def test_groups_are_offered_no_buffer_where_cuda_graphs_replay_them():
    """On a GPU with CUDA graphs on, a group takes no donated buffer (a
    donating group is never captured, and one launch is worth more there);
    with CUDA graphs off, or on the CPU, it takes those offered."""
    import dataclasses
    import types
    from lazy_mlir import config
    from lazy_mlir.run import executables
    offered = [3, 1]
    for device, graphs, accepted in (("cuda", True, []), ("cuda", False, [1, 3]), ("cpu", True, [1, 3])):
        group = types.SimpleNamespace(cfg=dataclasses.replace(config.Config(), device=device, cuda_graphs=graphs,
                                                              donate_buffers=True))
        assert executables.GroupExecutable.offer_donation(group, offered) == accepted, (device, graphs)
        assert group.cfg.donated_inputs == tuple(accepted)


def test_only_floating_point_state_is_writable():
    """Positions that no update could take (token ids, 0-d scalars, views)
    leave a group's donated set before its cache key is made: a group that
    reads its batch elsewhere in its first step only (test_cpp_wrapper's
    three-group model) then keeps one key and compiles once."""
    from lazy_mlir.codegen import donation
    w = torch.randn(4, 3)
    assert donation.writable(w) and donation.writable(w.double())
    assert not donation.writable(torch.randint(0, 5, (4, 3)))  # ids
    assert not donation.writable(torch.tensor(2.0))  # 0-d
    assert not donation.writable(w.t()) and not donation.writable(w[1:])  # not dense from its storage's start
    assert not donation.writable(3.0)


def test_a_state_rebuilt_from_its_own_elements_elsewhere_is_not_overwritten_while_read(donation):
    """A permutation of the state, or a shift of it (a scatter of its own
    elements): Inductor inlines the permutation into the kernel that writes
    the result, and scatters into the output buffer; written into the
    buffer they read, both would overwrite elements still to be read
    (torch 2.13 computes x.copy_(channel_shuffle(x)) wrongly in place,
    torch.compile too). Such an output gets a buffer of its own; a
    pointwise update of the same state is still written in place."""
    def run(device, update):
        state = torch.arange(64, dtype=torch.float64).reshape(1, 4, 4, 4).to(device)
        for _ in range(3):
            state.copy_(update(state))
            if device == LAZY:
                torch._lazy.mark_step()
        return state.cpu()

    shuffled = lambda t: torch.channel_shuffle(t, 2)  # noqa: E731
    before = _counters()
    torch.testing.assert_close(run(LAZY, shuffled), run(torch.device("cpu"), shuffled), rtol=0, atol=0)
    assert_compiled(calls=3)
    after = _counters()
    assert after["outputs_in_place"] == before["outputs_in_place"]
    # a state overwritten at other indices than it is read (x[1:] = x[:-1]): the same
    shifted = lambda t: t.flatten().index_put((torch.arange(1, 64, device=t.device),), t.flatten()[:-1]).view(t.shape)  # noqa: E731,E501
    torch.testing.assert_close(run(LAZY, shifted), run(torch.device("cpu"), shifted), rtol=0, atol=0)
    assert _counters()["outputs_in_place"] == after["outputs_in_place"]
    scaled = lambda t: t * 0.5 + 1  # noqa: E731
    torch.testing.assert_close(run(LAZY, scaled), run(torch.device("cpu"), scaled), rtol=0, atol=0)
    assert _counters()["outputs_in_place"] > after["outputs_in_place"]
