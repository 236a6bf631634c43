"""Channels-last activations through a CPU group's whole step
(codegen/conv_layout): a convolution block's forward, backward and SGD
update, traced to one graph as a lazy_mlir group holds it, compiled by
Inductor with and without the marks. With them no float activation is kept
contiguous beside its channels-last copy; the step computes eager's
numbers, and every output keeps its layout (a returned activation too).
On the lazy device, a conv net's group is compiled with the marks."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from lazy_mlir.codegen import conv_layout, inductor
from helpers import image_batches, make_convnet, sgd_momentum, trained_like_eager

aten = torch.ops.aten


def _block_step(x, w1, w2, gamma, beta, mean, var, buf1, buf2):
    """conv, batch norm, ReLU, max pool, a residual conv; gradients; SGD with momentum."""
    y = F.max_pool2d(F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), mean, var, gamma, beta, training=True)), 3, 2, 1)
    z = F.relu(F.conv2d(y, w2, padding=1) + y)
    loss = z.square().mean()
    d1, d2 = torch.autograd.grad(loss, [w1, w2])
    buf1, buf2 = buf1 * 0.9 + d1, buf2 * 0.9 + d2
    return loss, w1 - 0.1 * buf1, w2 - 0.1 * buf2, buf1, buf2


def _returning_the_activation(*args):
    """The step, also returning the second block's output (a value the user keeps)."""
    y = F.max_pool2d(F.conv2d(args[0], args[1], padding=1), 2)
    return (*_block_step(*args), F.relu(F.conv2d(y, args[2], padding=1)) * 2)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 3, 16, 16, generator=g), torch.randn(8, 3, 3, 3, generator=g).requires_grad_(),
            torch.randn(8, 8, 3, 3, generator=g).requires_grad_(), torch.rand(8, generator=g),
            torch.randn(8, generator=g), torch.zeros(8), torch.ones(8), torch.randn(8, 3, 3, 3, generator=g),
            torch.randn(8, 8, 3, 3, generator=g)]


def _compiled(step, mark: bool):
    """(marked convolutions, outputs on the inputs, generated code) of ``step``'s graph."""
    gm = make_fx(step, tracing_mode="fake")(*_inputs())
    fake_mode = FakeTensorMode()
    fakes = [fake_mode.from_tensor(t.detach()) for t in _inputs()]
    marked = conv_layout.rewrite(gm, fakes, fake_mode) if mark else 0
    run, code, _ = inductor.compile_graph(gm, fakes, fake_mode, "conv_layout_test")
    return marked, run([t.detach() for t in _inputs()]), code


def _contiguous_float_activations(code: str) -> list[str]:
    """The float32 batch-of-8-channel buffers the code allocates contiguous (NCHW)."""
    found = re.findall(r"empty_strided_cpu\(\((4, 8, \d+, \d+)\), \((\d+), (\d+), (\d+), 1\), torch\.float32\)", code)
    return [shape for shape, *strides in found if int(strides[1]) > 1]


def _assert_same(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
        assert a.stride() == e.stride(), (a.stride(), e.stride())


@pytest.fixture(scope="module")
def eager_step():
    args = _inputs()
    return _block_step(*args)


def test_a_training_step_keeps_its_activations_channels_last(eager_step):
    unmarked, plain_out, plain_code = _compiled(_block_step, mark=False)
    assert _contiguous_float_activations(plain_code), "the premise: Inductor alone keeps NCHW copies"
    marked, outputs, code = _compiled(_block_step, mark=True)
    assert marked == 2
    assert _contiguous_float_activations(code) == []
    assert code.count("transpose_mxn") < plain_code.count("transpose_mxn")
    _assert_same(outputs, [t.detach() for t in eager_step])
    _assert_same(outputs, plain_out)


def test_a_returned_activation_keeps_its_layout():
    marked, outputs, _ = _compiled(_returning_the_activation, mark=True)
    assert marked == 4
    expected = [t.detach() for t in _returning_the_activation(*_inputs())]
    assert outputs[-1].is_contiguous()
    _assert_same(outputs, expected)


def test_a_graph_without_convolutions_is_left_as_it_is():
    gm = make_fx(lambda x, w: (F.relu(x @ w).sum(),), tracing_mode="fake")(torch.randn(4, 8), torch.randn(8, 2))
    fake_mode = FakeTensorMode()
    before = gm.code
    assert conv_layout.rewrite(gm, [fake_mode.from_tensor(torch.randn(4, 8)), fake_mode.from_tensor(torch.randn(8, 2))],
                               fake_mode) == 0
    assert gm.code == before


def test_a_conv_net_trains_as_eager_with_its_convolutions_marked(tmp_path):
    trained_like_eager(tmp_path, make_convnet, sgd_momentum, image_batches(steps=3), 1e-5, 1e-6)
    exports = [p.read_text() for p in tmp_path.glob("*.4.export.fx.txt")]
    assert exports
    for exported in exports:  # each step graph's group: its two convolutions marked
        assert exported.count("aten.convolution.default(") == 2, exported
        assert exported.count("memory_format = torch.channels_last") == 2, exported
