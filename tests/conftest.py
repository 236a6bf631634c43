"""Fixtures: lazy_mlir initialised at a level, with clean metrics."""
import pytest

import lazy_mlir
from lazy_mlir import metrics


@pytest.fixture
def lazy_level(request):
    """Initialises lazy_mlir at the requested level with clean metrics."""
    level = getattr(request, "param", "O1")
    lazy_mlir.init(level)
    metrics.reset()
    yield level
    lazy_mlir.init("O1")

