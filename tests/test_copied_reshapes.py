"""Nested regrouping reshapes cut by row-major copies (codegen/copied_reshapes).

Funnel Transformer's relative shift (reshape a score matrix to its
transpose's shape, drop a row, reshape back, slice) and its backward nest
Inductor's index arithmetic: a remainder of a quotient of a remainder.
With the copies every index takes one remainder of a plain sum; without
them (the premise) the nesting is there. The step computes eager's
numbers either way. Attention's head splits and merges get no copy, and a
relative-shift model trains compiled on the lazy device with nothing
nested in its code."""
import re

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from lazy_mlir.codegen import copied_reshapes, inductor
from helpers import sgd, trained_like_eager

prims = torch.ops.prims


def _relative_shift(scores, context: int, shift: int):
    """HF Funnel's ``_relative_shift_gather``."""
    b, n, s, m = scores.shape
    x = torch.reshape(scores, [b, n, m, s])[:, :, shift:, :]
    return torch.reshape(x, [b, n, s, m - shift])[..., :context]


def _shift_step(q, r):
    """Positional scores of queries against relative positions, shifted; gradients."""
    scores = _relative_shift(torch.einsum("binh,tnh->bnit", q, r), 16, 1)
    loss = (scores.softmax(-1) * scores).sum()
    return (loss, *torch.autograd.grad(loss, [q, r]))


def _head_merge_step(x, w):
    """GPT's attention: split heads, attend, merge heads, project; gradients."""
    b, t, c = x.shape
    q, k, v = (x @ w).split(c, dim=-1)
    q, k, v = (z.reshape(b, t, 2, c // 2).transpose(1, 2) for z in (q, k, v))
    y = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    loss = (y.transpose(1, 2).reshape(b, t, c) @ w[:, :c]).square().sum()
    return (loss, *torch.autograd.grad(loss, [x, w]))


def _shift_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 16, 2, 8, generator=g).requires_grad_(),
            torch.randn(32, 2, 8, generator=g).requires_grad_()]


def _compiled(step, inputs, rewrite: bool):
    """(copies made, outputs on the inputs, generated code) of ``step``'s graph."""
    gm = make_fx(step, tracing_mode="fake")(*inputs())
    fake_mode = FakeTensorMode()
    fakes = [fake_mode.from_tensor(t.detach()) for t in inputs()]
    copies = copied_reshapes.rewrite(gm) if rewrite else 0
    run, code, _ = inductor.compile_graph(gm, fakes, fake_mode, "copied_reshapes_test")
    return copies, run([t.detach() for t in inputs()]), code


def _nested_remainders(code: str) -> list[str]:
    """The quotients and remainders in the generated C++ whose operand holds
    another (Inductor writes ``ModularIndexing(x, d, m)`` as one remainder
    of one quotient, ``(c10::div_floor_integer(x, d)) % m``: x is checked)."""
    found = []
    for match in re.finditer(r"c10::div_floor_integer\(|%", code):
        if match.group() == "%":  # its left operand: the parenthesized text before it
            end = code.rindex(")", 0, match.start())
            operand = code[_opening(code, end):end + 1]
            quotient = re.fullmatch(r"\(c10::div_floor_integer(\(.*\))\)", operand, re.S)
            operand = quotient[1] if quotient else operand
        else:
            operand = code[match.end() - 1:_closing(code, match.end() - 1) + 1]
        if "div_floor_integer" in operand or "%" in operand:
            found.append(operand)
    return found


def _closing(code: str, i: int) -> int:
    depth = 0
    for j in range(i, len(code)):
        depth += {"(": 1, ")": -1}.get(code[j], 0)
        if depth == 0:
            return j
    raise ValueError("unbalanced")


def _opening(code: str, i: int) -> int:
    depth = 0
    for j in range(i, -1, -1):
        depth += {")": 1, "(": -1}.get(code[j], 0)
        if depth == 0:
            return j
    raise ValueError("unbalanced")


def test_a_relative_shift_step_indexes_without_nested_remainders():
    expected = _shift_step(*_shift_inputs())
    _, plain_outputs, plain_code = _compiled(_shift_step, _shift_inputs, rewrite=False)
    assert _nested_remainders(plain_code), "the premise: Inductor alone nests the shift's reshapes"
    copies, outputs, code = _compiled(_shift_step, _shift_inputs, rewrite=True)
    assert copies == 2  # one in the forward's shift, one in its backward's
    assert _nested_remainders(code) == []
    for actual in (outputs, plain_outputs):
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e.detach(), rtol=1e-5, atol=1e-4)


def test_attention_head_splits_and_merges_get_no_copy():
    g = torch.Generator().manual_seed(0)
    gm = make_fx(_head_merge_step, tracing_mode="fake")(torch.randn(2, 8, 32, generator=g).requires_grad_(),
                                                        torch.randn(32, 96, generator=g).requires_grad_())
    assert any(n.target is torch.ops.aten._unsafe_view.default for n in gm.graph.nodes)  # a merge eager copies
    assert copied_reshapes.rewrite(gm) == 0
    assert not any(n.target is prims.inductor_force_stride_order.default for n in gm.graph.nodes)


class _RelativeShiftAttention(nn.Module):
    """Funnel's relative positional attention over a learned table, one head pair."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.out = nn.Linear(16, 16), nn.Linear(16, 4)
        self.positions = nn.Parameter(torch.randn(2 * 8, 2, 8) * 0.1)

    def forward(self, x, y):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 2, 8)
        scores = _relative_shift(torch.einsum("binh,tnh->bnit", q, self.positions), t, 1)
        context = torch.einsum("bnij,bjnh->binh", scores.softmax(-1), q).reshape(b, t, 16)
        return nn.functional.cross_entropy(self.out(context).flatten(0, 1), y.flatten())


def _shift_batches(steps=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 8, 16, generator=g), torch.randint(0, 4, (2, 8), generator=g)) for _ in range(steps)]


def test_a_relative_shift_model_trains_compiled_without_nested_remainders(tmp_path):
    code = trained_like_eager(tmp_path, _RelativeShiftAttention, sgd, _shift_batches(), rtol=1e-5, atol=1e-6)
    exported = "\n".join(p.read_text() for p in tmp_path.glob("*.4.export.fx.txt"))
    assert "inductor_force_stride_order" in exported
    assert _nested_remainders(code) == []
