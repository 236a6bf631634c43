"""Inductor's C++ wrapper around a group's kernels (Config.cpp_wrapper, on by
default; the rest of the suite runs the Python wrapper, see conftest).

Each test trains against eager and checks, besides the numbers, that the
groups ran generated code (not TorchScript) and that this code is the C++
wrapper's: the dumped module loads it through CppWrapperCodeCache.
"""
from pathlib import Path

import pytest
import torch

import lazy_mlir
from lazy_mlir import metrics
from helpers import (LAZY, assert_compiled, assert_same_training, image_batches, make_adamw, make_convnet,
                     sgd_momentum, small_gpt, small_gpt_batches, train)

CPU = torch.device("cpu")


@pytest.fixture
def cpp_wrapped(tmp_path):
    lazy_mlir.init("O1", cpp_wrapper=True, dump_dir=str(tmp_path))
    metrics.reset()
    yield tmp_path
    lazy_mlir.init("O1")


def _wrappers(dump_dir: Path) -> set[str]:
    """Which wrapper each group's generated code has ("C++" or "Python")."""
    kinds = set()
    for generated in dump_dir.glob("*.5.generated.py"):
        code = generated.read_text()
        if "served from Inductor's cache" not in code:
            kinds.add("C++" if "CppWrapperCodeCache" in code else "Python")
    return kinds


def test_convnet_with_momentum_matches_eager(cpp_wrapped):
    """SGD's momentum buffers are clones of transposed gradients: the next
    step's graph takes them transposed, which the C++ wrapper checks against
    the code's inputs (first seen failing: the export's contiguous
    placeholders were what it checked)."""
    def make():
        return make_convnet().double()

    batches = [(x.double(), y) for x, y in image_batches(4)]
    eager = train(make, sgd_momentum, batches, CPU)
    lazy = train(make, sgd_momentum, batches, LAZY)
    assert_same_training(eager, lazy, rtol=1e-12, atol=1e-12)
    assert_compiled(calls=4)
    assert _wrappers(cpp_wrapped) == {"C++"}


def test_captured_gpt_matches_eager(cpp_wrapped):
    batches = small_gpt_batches(3)

    def make():
        return lazy_mlir.capture(small_gpt())

    eager = train(make, make_adamw, batches, CPU)
    lazy = train(make, make_adamw, batches, LAZY)
    assert_same_training(eager, lazy, rtol=2e-5, atol=2e-5)
    s = metrics.snapshot()
    assert s["captured_calls"] == 3 and s["fallback_count"] == 0, metrics.report()
    assert_compiled(s, calls=3)
    assert _wrappers(cpp_wrapped) == {"C++"}
