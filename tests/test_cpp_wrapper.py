"""Inductor's C++ wrapper around a group's kernels (Config.cpp_wrapper, on by
default; the rest of the suite runs the Python wrapper, see conftest), and
CompiledGroup calling that code from C++ (lazy_mlir.codegen.native_call).

Each test trains against eager and checks, besides the numbers, that the
groups ran generated code (not TorchScript), that this code is the C++
wrapper's (the dumped module loads it through CppWrapperCodeCache) and
that every run after a group's first called it from C++.
"""
import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.codegen import native_call
from lazy_mlir.observe import metrics
from helpers import (LAZY, assert_compiled, assert_same_training, image_batches, make_adamw, make_convnet,
                     sgd_momentum, small_gpt, small_gpt_batches, stochastic_units, train, train_token_batches)

CPU = torch.device("cpu")


@pytest.fixture
def cpp_wrapped(tmp_path):
    """Each group compiled in this test, its code dumped: an earlier test's
    graph (LTC's cache) or Inductor module loaded in this process (then no
    new module to dump) would hide which wrapper the code has."""
    from torch._inductor.codecache import PyCodeCache
    lazy_mlir.init("O1", cpp_wrapper=True, dump_dir=str(tmp_path))
    lazy_mlir.native._C.clear_computation_cache()
    PyCodeCache.cache_clear()
    metrics.reset()
    yield tmp_path
    lazy_mlir.init("O1")


def _assert_native_calls(s: dict) -> None:
    """Each group's first run (through Python: the probe) is its only run
    not called from C++."""
    assert s["native_group_calls"] == s["compiled_group_calls"] - s["groups_built"] > 0, metrics.report()


def _wrappers(dump_dir: Path) -> set[str]:
    """Which wrapper each group's generated code has: "C++" (built apart
    from its kernels, codegen/inductor.py), "C++ with its kernels" or "Python"."""
    kinds = set()
    for generated in dump_dir.glob("*.5.generated.py"):
        code = generated.read_text()
        if "served from Inductor's cache" not in code:
            if "CppWrapperCodeCache" not in code:
                kinds.add("Python")
            else:
                kinds.add("C++" if "kernel_code=kernel_src" in code else "C++ with its kernels")
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
    _assert_native_calls(metrics.snapshot())


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
    _assert_native_calls(s)


def test_baked_scalars_are_checked_before_a_native_call(cpp_wrapped):
    """leaky_relu's slope is baked into the code and guarded by the very
    tensor LTC hands over for it (executables.ScalarGuards). A native call
    must check the same: 0.0 and -0.0 run different code (1 / (x * 0.0) is
    -inf for x < 0, 1 / (x * -0.0) +inf), so calling the last code for
    another slope gives the wrong sign."""
    x = -torch.arange(1.0, 42.0).reshape(1, 41)  # a shape of this test's own

    def inverse(t, slope):
        return 1 / F.leaky_relu(t, slope)

    for slope in (0.0, 0.0, -0.0, -0.0, 0.0, float("nan"), float("nan")):
        got = inverse(x.to(LAZY), slope)
        torch._lazy.mark_step()
        torch.testing.assert_close(got.cpu(), inverse(x, slope), equal_nan=True, msg=f"slope {slope!r}")
    s = metrics.snapshot()
    assert s["groups_fallen_back"] == {}
    assert s["native_group_calls"] >= 3, metrics.report()  # the repeated slopes: 0.0, -0.0, NaN


def test_native_calls_switched_off_run_through_python(tmp_path):
    """Config.native_calls=False takes effect for groups already bound (the
    convnet's graphs may be compiled by the test above)."""
    lazy_mlir.init("O1", cpp_wrapper=True, native_calls=False)
    metrics.reset()
    try:
        batches = [(x.double(), y) for x, y in image_batches(4)]
        eager = train(lambda: make_convnet().double(), sgd_momentum, batches, CPU)
        lazy = train(lambda: make_convnet().double(), sgd_momentum, batches, LAZY)
        assert_same_training(eager, lazy, rtol=1e-12, atol=1e-12)
        s = metrics.snapshot()
        assert_compiled(s, calls=4)
        assert s["native_group_calls"] == 0, metrics.report()
    finally:
        lazy_mlir.init("O1")


def _generated_module(library="/cache/entry.so"):
    """What the probe sees of a C++ wrapper's generated module: ``call``
    and the loaded extension's ``inductor_entry``."""
    module = {"inductor_entry": types.SimpleNamespace(__self__=types.SimpleNamespace(__file__=library))}
    exec("def call(args):\n    pass", module)
    return types.SimpleNamespace(current_callable=module["call"])


def test_probe_plans_only_calls_the_wrapper_left_alone():
    a, b, c = torch.ones(2), torch.ones(3), torch.ones(4)
    r0, r1 = torch.zeros(2), torch.zeros(3)
    graph = _generated_module()
    plan = native_call._plan([a, b, c], [r1, a, r0], [(graph, [c, a], [r0, r1])])
    assert plan == native_call.Plan("/cache/entry.so", [2, 0], 2, [1, -1, 0])
    assert native_call._plan([a], [r0], [(graph, [a], [r0]), (graph, [a], [r0])]) is None  # two calls
    assert native_call._plan([a], [r0], [(graph, [torch.ones(2)], [r0])]) is None  # an argument made by the wrapper
    assert native_call._plan([a], [r0[:1]], [(graph, [a], [r0])]) is None  # an output rebuilt (a view)
    assert native_call._plan([a], [r0], [(graph, [a], [r0, r1])]) is None  # a result used otherwise
    python_wrapper = types.SimpleNamespace(current_callable=lambda args: None)
    assert native_call._plan([a], [r0], [(python_wrapper, [a], [r0])]) is None


def test_probe_plans_the_aliases_the_wrapper_rebuilt():
    """AOTAutograd returns a new view for an output that aliases an input,
    though the code returned the same elements as a result: the plan takes
    that result and returns an alias of it (native_entry.h). A result that is
    another output's buffer, or an input's memory written in place, is no
    result used otherwise."""
    w = torch.arange(16.0).reshape(4, 4)  # a weight the code wrote in place
    graph = _generated_module()
    results = [w.as_strided((4, 4), (4, 1)), w.as_strided((4, 4), (1, 4))]  # the code's views of it
    rebuilt = [w.view(4, 4), w.t()]  # the wrapper's
    plan = native_call._plan([w], rebuilt, [(graph, [w], results)])
    assert plan == native_call.Plan("/cache/entry.so", [0], 2, [0, 1], [0, 1])
    assert native_call._plan([w], [w.t()[:2]], [(graph, [w], results)]) is None  # laid out like no result
    assert native_call._plan([w], [w.t()], [(graph, [w], [results[0]])]) is None  # another layout
    twice = torch.zeros(3)  # one buffer for two outputs: the code returns it twice
    plan = native_call._plan([w], [twice, twice], [(graph, [w], [twice, twice])])
    assert plan == native_call.Plan("/cache/entry.so", [0], 2, [1, 1], [])
    written = native_call._plan([w], [twice], [(graph, [w], [twice, w.view(4, 4)])])  # the input's own memory
    assert written == native_call.Plan("/cache/entry.so", [0], 2, [0], [])


class _ScaledStochasticMLP(torch.nn.Module):
    """helpers.StochasticMLP with its input scaled by a weight: the backward
    multiplies by fc1's weight transposed twice, a view of the weight the
    first group returns to the last, which AOTAutograd's wrapper rebuilt (no
    native plan until 2026-12-01). Its lines are its own: another group
    family than StochasticMLP's, which other files' tests compile differently."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        self.scale = torch.nn.Parameter(torch.ones(16))

    def forward(self, x, y):
        h = stochastic_units(F.gelu(self.fc1(x * self.scale)))
        h = stochastic_units(torch.tanh(self.fc2(h)))
        return F.cross_entropy(self.fc3(h), y)


def test_outputs_aliasing_inputs_are_called_from_cpp(cpp_wrapped):
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
               for _ in range(4)]

    def make():
        torch.manual_seed(0)
        return _ScaledStochasticMLP().double()

    runs = []
    for device in (CPU, LAZY):
        torch.manual_seed(123)  # the same draws
        runs.append(train(make, make_adamw, batches, device))
    assert_same_training(*runs, rtol=1e-12, atol=1e-12)
    generated = "\n".join(p.read_text() for p in cpp_wrapped.glob("*.5.generated.py"))
    assert "reinterpret_tensor_wrapper(arg" in generated  # the premise: a result is a view of an input
    s = metrics.snapshot()
    assert s["groups_built"] == 3 and s["groups_fallen_back"] == {}, metrics.report()
    _assert_native_calls(s)


def test_a_buffer_returned_for_two_outputs_is_called_from_cpp(cpp_wrapped):
    """A tensor and its detach() after an in-place update are one buffer: the
    code returns its handle twice, which C++ takes once (freed twice, it
    crashed the process)."""
    x = torch.linspace(-2, 2, 37 * 3).reshape(3, 37)  # a shape of this test's own
    w, expected = x.clone().to(LAZY), x.clone()
    torch._lazy.mark_step()
    for _ in range(4):
        w.mul_(0.5).add_(w.sin())
        detached = w.detach()
        expected.mul_(0.5).add_(expected.sin())
        torch._lazy.mark_step()
        torch.testing.assert_close(detached.cpu(), expected)
        torch.testing.assert_close(w.cpu(), expected)
    generated = "\n".join(p.read_text() for p in cpp_wrapped.glob("*.5.generated.py"))
    assert "output_handles[1] = output_handles[0];" in generated  # the premise
    s = metrics.snapshot()
    assert s["groups_fallen_back"] == {}, metrics.report()
    _assert_native_calls(s)


def test_a_library_without_the_entry_is_refused():
    """What native_entry.h loads must be the loaded C++ wrapper's library with
    its entry; anything else is an error the executable turns into a
    warning (the code then runs through Python)."""
    from lazy_mlir.native import _C
    slot = _C.NativeEntrySlot()
    with pytest.raises(RuntimeError, match="cannot load"):
        slot.set("/nonexistent/entry.so", [0], 1, [0], [], [torch.ones(2)], [], [])
    with pytest.raises(RuntimeError, match="has no"):
        slot.set(_C.__file__, [0], 1, [0], [], [torch.ones(2)], [], [])  # loaded, but no inductor_entry_impl
    assert not slot.active


TRAINING_CHILD = """
import copy, json, os, sys, torch, lazy_mlir
from lazy_mlir import metrics
from lazy_mlir.compile import parallel
sys.path.insert(0, {tests!r})
from helpers import StochasticMLP
stochastic = sys.argv[1] == "stochastic"
# three groups, compiled side by side with a worker whatever their size
lazy_mlir.init("O1", cpp_wrapper=True, progress=False, **(dict(compile_workers=1) if stochastic else {{}}))
parallel.MIN_OPS_FOR_WORKERS = 0


class GatheringMLP(StochasticMLP):
    # rows gathered at an index a 0-d input offsets: out of bounds on zero
    # inputs, which a worker's run of new code must not be given
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 16))
        self.last = torch.nn.Buffer(torch.tensor(7))

    def forward(self, x, y):
        index = (self.last - torch.arange(8, device=x.device)).unsqueeze(1).expand(8, 16)
        return super().forward(x + torch.gather(self.table, 0, index), y)


torch.manual_seed(0)
if stochastic:
    eager = GatheringMLP().double()
else:
    eager = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 3)).double()
lazy = copy.deepcopy(eager).to("lazy")
features, classes = (16, 4) if stochastic else (12, 3)
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, features, generator=g, dtype=torch.float64), torch.randint(0, classes, (8,), generator=g))
           for _ in range(4)]
losses = {{"eager": [], "lazy": []}}
for name, model, device in (("eager", eager, "cpu"), ("lazy", lazy, "lazy")):
    torch.manual_seed(123)  # the same draws
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if stochastic else 0.9)  # stochastic: one graph
    for x, y in batches:
        loss = model(x.to(device), y.to(device)) if stochastic else torch.nn.functional.cross_entropy(
            model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device == "lazy":
            torch._lazy.mark_step()
        losses[name].append(loss.item())
compiler = [m for m in ("torch_mlir", "lazy_mlir.lowering.group_lowering", "torch._inductor.compile_fx", "mlir_passes.pipeline")
            if m in sys.modules]
print(json.dumps({{"losses": losses, "metrics": metrics.snapshot(), "compiler": compiler}}, default=str))
""".format(tests=os.path.dirname(os.path.abspath(__file__)))


def _cached_child(cache_dir, model="mlp", **env) -> dict:
    """Trains ``model`` ("mlp", or "stochastic": three groups, a gather) in a fresh process
    beside eager; its losses, metrics and the compiler modules it loaded."""
    result = subprocess.run([sys.executable, "-c", TRAINING_CHILD, model], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "LAZY_MLIR_CACHE_DIR": str(cache_dir), "LAZY_MLIR_CPP_WRAPPER": "1",
                                 **env})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(out["losses"]["lazy"], out["losses"]["eager"], rtol=1e-12, atol=1e-12)
    s = out["metrics"]
    assert s["fallback_count"] == 0 and s["groups_fallen_back"] == {}, s
    assert s["compiled_group_calls"] >= 4, s
    return out


def test_isolated_compile_keeps_the_compiler_out_of_the_training_process(tmp_path):
    """Config.isolated_compile (the default): the first process compiles its
    groups in a worker and calls the libraries from C++; it never imports
    torch-mlir, the lowering or Inductor's compiler. The next process loads
    the groups from the cache (compile_cache.store_native), also without them
    (the memory a training process saves: docs/performance.md)."""
    cold = _cached_child(tmp_path)
    s = cold["metrics"]
    assert s["group_cache_misses"] >= 1 and s["stage_runs"].get("isolated_compile", 0) == s["group_cache_misses"], s
    assert s["isolated_compile_failures"] == 0, s
    assert cold["compiler"] == [], f"a process whose groups compiled in a worker loaded {cold['compiler']}"
    assert s["native_group_calls"] == s["compiled_group_calls"] - s["group_cache_misses"], s
    warm = _cached_child(tmp_path)
    assert any(name.endswith(".so") for name in os.listdir(tmp_path))  # the libraries, written out to be loaded
    s = warm["metrics"]
    assert s["group_cache_misses"] == 0 and s["group_cache_native_loads"] == s["group_cache_disk_hits"] >= 1, s
    assert warm["compiler"] == [], f"a process running cached code loaded {warm['compiler']}"
    # every run from C++ but each group's first, which Python hands to the library
    assert s["native_group_calls"] == s["compiled_group_calls"] - s["group_cache_native_loads"], s
    assert warm["losses"] == cold["losses"]


def test_code_probed_here_is_stored_for_the_next_process(tmp_path):
    """Compiled in the training process (isolated_compile off), a group's
    first run probes its code, and the plan goes to the cache with it."""
    cold = _cached_child(tmp_path, LAZY_MLIR_ISOLATED_COMPILE="0")
    assert cold["metrics"]["group_cache_misses"] >= 1 and "lazy_mlir.lowering.group_lowering" in cold["compiler"]
    warm = _cached_child(tmp_path)
    s = warm["metrics"]
    assert s["group_cache_misses"] == 0 and s["group_cache_native_loads"] == s["group_cache_disk_hits"] >= 1, s
    assert warm["compiler"] == [] and warm["losses"] == cold["losses"]


def test_code_from_the_cache_without_native_calls_loads_inductors_artefact(tmp_path):
    """With Config.native_calls off, a group loaded as a library runs
    through Python: Inductor's artefact is loaded at its first run."""
    _cached_child(tmp_path)
    out = _cached_child(tmp_path, LAZY_MLIR_NATIVE_CALLS="0")
    s = out["metrics"]
    assert s["group_cache_misses"] == 0 and s["native_group_calls"] == 0, s
    assert "lazy_mlir.lowering.group_lowering" in out["compiler"]


class _TokenMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16)

    def forward(self, ids):
        return torch.relu(self.fc(self.emb(ids))).softmax(-1).pow(2).mean()


@pytest.mark.compiles_in_step("counts the generic compile in the step of the new size")
@pytest.mark.op_by_op("the per-op trace's shape-generic code at the second size")
def test_generic_code_is_native_code_in_the_next_process(tmp_path):
    """Shape-generic code called from C++ at some sizes keeps its native plan
    for those sizes in the cache folder (shape_generic.sized_key): the next
    process runs it from C++ from its first run at them, without loading
    Inductor's artefact through Python (T5's and BART's attention groups,
    generic over their encoder and decoder lengths)."""
    from lazy_mlir.cache import compile_cache
    from lazy_mlir.compile import shape_generic
    torch.manual_seed(0)
    eager = _TokenMLP().double()
    shapes = [(2, 8), (2, 8), (2, 12), (2, 12)]
    want = train_token_batches(copy.deepcopy(eager), shapes, CPU)
    lazy_mlir.init("O1", cpp_wrapper=True, cache_dir=str(tmp_path))
    try:
        shape_generic.clear()
        lazy_mlir.native._C.clear_computation_cache()
        *got, steps = train_token_batches(copy.deepcopy(eager).to(LAZY), shapes, LAZY)
        assert [s["generic_compiles"] for s in steps] == [0, 0, 1, 0], steps
        assert_same_training(want[:2], got, rtol=1e-12, atol=1e-12)
        # the next process: nothing in memory, the folder on disk
        shape_generic.clear()
        compile_cache.clear_memory()
        lazy_mlir.native._C.clear_computation_cache()
        *got, steps = train_token_batches(copy.deepcopy(eager).to(LAZY), shapes, LAZY)
        assert_same_training(want[:2], got, rtol=1e-12, atol=1e-12)
        for s in steps:
            assert_compiled(s)  # generated code, not TorchScript
        first = steps[2]  # length 12's first step: served by the stored generic variant
        assert first["generic_compiles"] == 0 and first["generic_hits"] >= 1, first
        assert first["generic_native_loads"] == first["generic_hits"], first
        assert "cache_load" not in first["stage_runs"], first["stage_runs"]  # no artefact loaded through Python
        assert steps[3]["native_group_calls"] == steps[3]["compiled_group_calls"] >= 1, steps[3]
    finally:
        lazy_mlir.init("O1")


def test_a_graph_travels_to_the_worker_with_its_constants_exact():
    """The IR text rounds floats and prints bool lists as ints and tensor
    constants as nothing: isolated_compile sends those values beside it."""
    from lazy_mlir.cache import group_key
    from lazy_mlir.compile import isolated
    # an empty int list (T5's graph has one; it parses back as None)
    graph = torch._C.parse_ir("graph(%x : Tensor):\n  %e : int[] = prim::ListConstruct()\n  return (%x, %e)\n")
    torch._C._jit_pass_constant_propagation(graph)
    for value in ([True, False], torch.tensor([0.1, -2.5e-7]), 0.1, [3, 1]):
        graph.registerOutput(graph.insertConstant(value))
    rebuilt = isolated.graph_from_message(isolated.graph_message(graph))
    assert group_key.structure(rebuilt) == group_key.structure(graph)
    values = [n.output().toIValue() for n in rebuilt.nodes() if n.kind() == "prim::Constant"]
    assert repr(values[1]) == "[True, False]" and values[2].equal(torch.tensor([0.1, -2.5e-7]))
    assert values[0] == [] and values[3:] == [0.1, [3, 1]]


def test_a_group_the_worker_fails_compiles_here(monkeypatch):
    """Whatever the worker cannot do (here: IR it cannot parse) the training
    process compiles itself: the group still runs generated code."""
    from lazy_mlir.compile import isolated
    real = isolated.graph_message
    monkeypatch.setattr(isolated, "graph_message", lambda graph: {**real(graph), "ir": "not IR"})
    lazy_mlir.init("O1", cpp_wrapper=True, cache=False)
    metrics.reset()
    try:
        x = torch.linspace(-3, 3, 43 * 5).reshape(5, 43)
        y = (x.to(LAZY).sin() * 3).sum(1)
        torch._lazy.mark_step()
        torch.testing.assert_close(y.cpu(), (x.sin() * 3).sum(1))
        s = metrics.snapshot()
        assert s["isolated_compile_failures"] == 1 and s["groups_fallen_back"] == {}, metrics.report()
        assert_compiled(s, calls=1)
    finally:
        lazy_mlir.init("O1")


def test_a_graph_of_several_groups_compiles_them_in_workers(tmp_path):
    """parallel_compile with isolated_compile: each group is lowered to FX in
    the compile worker during the graph's first execution (for the layouts
    its code will return), and its code generated there or in a second
    worker at the end of it, each run there once on inputs holding the 0-d
    values (an index computed from one is in bounds); the training process
    loads none of the compiler, and trains as eager."""
    out = _cached_child(tmp_path, "stochastic")
    s = out["metrics"]
    assert s["group_cache_misses"] == s["stage_runs"].get("isolated_prepare") == 3, s
    assert s["isolated_compile_failures"] == 0 and s["groups_fallen_back"] == {} and s["fallback_count"] == 0, s
    # the first step's groups in TorchScript while their code compiled, every later call generated code
    assert s["interpreted_group_calls"] == 3 and s["compiled_group_calls"] == s["group_calls"] - 3 >= 6, s
    assert out["compiler"] == [], f"a process whose groups compiled in workers loaded {out['compiler']}"


def test_a_dead_compile_worker_is_replaced():
    """A worker that died (killed, out of memory) costs the group in hand a
    compile here, and the next compile gets a new worker."""
    from lazy_mlir.compile import isolated
    lazy_mlir.init("O1", cpp_wrapper=True, cache=False)
    metrics.reset()
    try:
        x = torch.linspace(-2, 2, 47 * 3).reshape(3, 47)
        results = []
        for k, fn in enumerate((torch.cos, torch.sinh, torch.atan)):  # a group of its own each
            if k == 1:
                isolated._worker.process.kill()
                isolated._worker.process.wait()
            y = (fn(x.to(LAZY)) * (k + 2)).sum(0)
            torch._lazy.mark_step()
            results.append((y.cpu(), (fn(x) * (k + 2)).sum(0)))
        for got, want in results:
            torch.testing.assert_close(got, want)
        s = metrics.snapshot()
        assert s["isolated_compile_failures"] == 1 and s["stage_runs"].get("isolated_compile") == 2, metrics.report()
        assert s["groups_fallen_back"] == {} and isolated._worker.alive
    finally:
        lazy_mlir.init("O1")


ZOO_CHILD = """
import copy, json, sys, torch, lazy_mlir
from lazy_mlir import metrics
sys.path.insert(0, {zoo!r})
import zoo
lazy_mlir.init("O1", progress=False)  # the defaults: C++ wrapper, isolated compile, one compile worker here
v, spec = zoo.base_variant("gpt2", dropout=0.1), zoo.SPECS["gpt2"]
eager = zoo.make_model(v)
lazy = copy.deepcopy(eager).to("lazy")
losses = {{}}
for name, model, device in (("eager", eager, "cpu"), ("lazy", lazy, "lazy")):
    model.train()
    opt = spec.optimizer(model)
    torch.manual_seed(0)  # the same dropout masks
    losses[name] = []
    for batch in zoo.batches(v, 3)[:3]:
        loss = spec.loss(model, *(t.to(device) for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "lazy":
            torch._lazy.mark_step()
        losses[name].append(loss.item())
compiler = [m for m in ("torch_mlir", "lazy_mlir.lowering.group_lowering", "torch._inductor.compile_fx")
            if m in sys.modules]
print(json.dumps({{"losses": losses, "metrics": metrics.snapshot(), "compiler": compiler}}, default=str))
""".format(zoo=os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))


def _train_zoo_child(cache_dir) -> dict:
    result = subprocess.run([sys.executable, "-c", ZOO_CHILD], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAZY_MLIR_CACHE_DIR": str(cache_dir), "LAZY_MLIR_CPP_WRAPPER": "1",
                                 "LAZY_MLIR_COMPILE_WORKERS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(out["losses"]["lazy"], out["losses"]["eager"], rtol=1e-9, atol=1e-9)
    s = out["metrics"]
    assert s["groups_fallen_back"] == {} and s["fallback_count"] == 0 and s["isolated_compile_failures"] == 0, s
    assert s["native_group_calls"] == s["compiled_group_calls"] - s["groups_built"], s  # every run after the first
    assert out["compiler"] == [], f"HF GPT-2's training process loaded {out['compiler']}"
    return s


def test_hf_gpt2_with_dropout_compiles_in_workers(tmp_path):
    """A model nobody here wrote, as users train it (dropout 0.1, eager's
    masks drawn in the glue ahead of the step's one group), with the
    defaults: the group is compiled in a worker, the training process loads
    none of the compiler (the code is called from C++ after its first run;
    Inductor's loader of code, codecache, comes with AOTAutograd, which
    records the captured model), and it trains as eager. A second process on the same cache compiles nothing.
    (Several groups a step, whose later groups may adapt to the layouts the
    earlier return: test_a_graph_of_several_groups_compiles_them_in_workers.)"""
    s = _train_zoo_child(tmp_path)
    assert s["stage_runs"].get("isolated_compile") == s["group_cache_misses"] >= 1, s  # in the worker
    assert s["compiled_group_calls"] == s["group_calls"] - s["interpreted_group_calls"] > 0, s  # after the first step
    again = _train_zoo_child(tmp_path)
    assert again["group_cache_misses"] == 0 and again["group_cache_disk_hits"] == s["group_cache_misses"], again
    assert again["compiled_group_calls"] == again["group_calls"], again  # no step in TorchScript
