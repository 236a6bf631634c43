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



@pytest.fixture
def gloo_world(tmp_path):
    """A one-rank gloo process group in this process (a file store: no
    port), destroyed afterwards so no other test sees torch.distributed."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'gloo_store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
