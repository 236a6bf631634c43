"""Fixtures: lazy_mlir initialised at a level, with clean metrics."""
import atexit
import os
import shutil
import tempfile

import pytest

# The suite neither reads nor fills the user's compile cache: one folder per
# session (subprocesses inherit it), set before lazy_mlir reads its config.
_SESSION_CACHE = tempfile.mkdtemp(prefix="lazy_mlir_test_cache_")
os.environ["LAZY_MLIR_CACHE_DIR"] = _SESSION_CACHE
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
# The suite runs the product's defaults: background compiles, compile
# workers, Inductor's C++ wrapper, each static CPU group compiled in a worker
# process. Tests marked compiles_in_step check generated code in the very
# step that brings a new graph or size, so their compiles wait in the step;
# tests marked python_wrapper watch the in-process pipeline (stages
# monkeypatched or counted, runs made to fail) and get the Python wrapper.
# Each marker says why where it is used.
# make test runs two pytest-xdist workers: one OpenMP thread each (torch
# reads this at import; children inherit it), else each worker's second
# thread spins at every barrier on the core the other worker needs (the
# tiny models gain nothing from it).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import lazy_mlir  # noqa: E402
from lazy_mlir.cache import compile_cache
from lazy_mlir.compile import shape_generic  # noqa: E402
from lazy_mlir.observe import metrics

# The files that take longest (3-rank ZeRO runs: ~10 min of a worker cold;
# the model zoo's compiles: ~8) are collected first: make test's xdist
# workers take whole files in collection order (--no-loadscope-reorder),
# and one of these last would leave a worker alone at the end.
_LONGEST_FIRST = ("zero/test_zero.py", "models/test_zoo.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.as_posix()
        return next((i for i, name in enumerate(_LONGEST_FIRST) if path.endswith(name)), len(_LONGEST_FIRST))
    items.sort(key=rank)  # stable: each file's tests keep their order


# What each marker sets (environment variables: read by each Config, and
# inherited by the processes a test starts).
_IN_STEP = {"LAZY_MLIR_BACKGROUND_COMPILE": "0", "LAZY_MLIR_COMPILE_WORKERS": "0"}
_MARKED = {
    # new graphs and sizes compile in the step that brings them: one group
    # after the other, shape-generic code too (not side by side, not in the
    # background while the step runs TorchScript)
    "compiles_in_step": _IN_STEP,
    # compiled in this process with the Python wrapper, group runs called
    # from Python: the in-process pipeline such a test instruments
    "python_wrapper": {**_IN_STEP, "LAZY_MLIR_CPP_WRAPPER": "0"},
    # every module call traced op by op (Config.capture "off"): a test of a
    # mechanism of the per-op trace that automatic capture would bypass
    "op_by_op": {"LAZY_MLIR_CAPTURE": "off"},
}


@pytest.fixture(autouse=True)
def _configured_as_marked(request):
    settings = {}
    for marker, env in _MARKED.items():
        if request.node.get_closest_marker(marker) is not None:
            settings.update(env)
    if not settings:
        yield
        return
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    lazy_mlir.init("O1")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        lazy_mlir.init("O1")


@pytest.fixture
def lazy_level(request):
    """Initialises lazy_mlir at the requested level with clean metrics."""
    level = getattr(request, "param", "O1")
    lazy_mlir.init(level)
    metrics.reset()
    shape_generic.clear()  # sizes seen by earlier tests do not make this one's groups generic
    compile_cache.forget_failures()
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


@pytest.fixture
def lowerings(monkeypatch):
    """Names of the groups really lowered (cache misses that compile)."""
    from lazy_mlir.compile import routes
    from lazy_mlir.lowering import group_lowering

    calls = []

    def counting(graph, inputs, name, cfg):
        calls.append(name)
        return group_lowering.lower_group(graph, inputs, name, cfg)

    monkeypatch.setattr(routes, "lower_group", counting)
    return calls
