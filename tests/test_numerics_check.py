"""The numerics checker (init(check=True)) and the minifier, on a miscompile
injected into Inductor's lowering of ``aten.sub`` (tests/miscompile_injection.py)
and into the MLIR stage (tests/mlir_miscompile_injection.py).

The checker must find the disagreeing group at its first run, name the ops
and source lines, run the group in TorchScript from then on (training equal
to eager), and write a case that ``python -m lazy_mlir.minify`` shrinks to
the flipped op alone, as a script that reproduces it standalone.
Compiles run in this process (isolated_compile off): the injection lives here.
"""
import glob
import importlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import lazy_mlir
from lazy_mlir import minify
from lazy_mlir.cache import compile_cache
from lazy_mlir.observe import metrics
from helpers import CPU, LAZY, SMALL_GPT, gpt_batches, make_adamw, make_gpt

TESTS = os.path.dirname(__file__)


class Centered(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.center = nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.fc(x) - self.center  # the subtraction whose lowering is flipped
        return (h * h).mean()


def _train(device, steps=3):
    torch.manual_seed(0)
    model = Centered().double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(5, 6, generator=g, dtype=torch.float64).to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazy":
            torch._lazy.mark_step()
        losses.append(loss.item())
    return torch.tensor(losses), {n: p.detach().cpu() for n, p in model.named_parameters()}


@pytest.fixture
def injected(tmp_path, monkeypatch):
    """The miscompile, in this process and in processes started from it."""
    from torch._inductor import lowering
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MISCOMPILE_INJECTION_DIR", str(tmp_path))
    monkeypatch.setitem(lowering.lowerings, torch.ops.aten.sub.Tensor, lowering.lowerings[torch.ops.aten.sub.Tensor])
    monkeypatch.syspath_prepend(TESTS)
    sys.modules.pop("miscompile_injection", None)
    importlib.import_module("miscompile_injection")
    yield tmp_path
    sys.modules.pop("miscompile_injection", None)
    compile_cache.clear_memory()  # the group's remembered failure: the injection made it


@pytest.fixture
def injected_in_mlir(tmp_path, monkeypatch):
    """The miscompile in the MLIR stage, in this process and in processes
    started from it (the minifier's worker, the reproducer)."""
    import mlir_passes
    monkeypatch.setenv("MISCOMPILE_INJECTION_DIR", str(tmp_path))
    monkeypatch.setattr(mlir_passes, "run_pipeline", mlir_passes.run_pipeline)  # put back afterwards
    monkeypatch.syspath_prepend(TESTS)
    sys.modules.pop("mlir_miscompile_injection", None)
    importlib.import_module("mlir_miscompile_injection")
    yield tmp_path
    sys.modules.pop("mlir_miscompile_injection", None)
    compile_cache.clear_memory()


@pytest.fixture
def checking(tmp_path):
    lazy_mlir.init("O1", check=True, isolated_compile=False, compile_workers=0, cache=False,
                   background_compile=False, dump_dir=str(tmp_path / "dumps"))
    metrics.reset()
    yield
    lazy_mlir.init("O1")


def test_an_injected_miscompile_is_found_reported_and_trained_around(injected, checking):
    lazy_mlir.native._C.clear_computation_cache()
    eager_losses, eager_params = _train(CPU)
    with pytest.warns(RuntimeWarning, match="disagrees with TorchScript") as caught:
        lazy_losses, lazy_params = _train(LAZY)
    text = next(str(w.message) for w in caught if "disagrees" in str(w.message))
    assert "stage at fault: codegen" in text and "test_numerics_check.py" in text, text
    s = metrics.snapshot()
    assert s["checks_mismatched"] >= 1 and s["groups_fallen_back"], metrics.report()
    # training went on correctly: TorchScript ran the group from the mismatch on
    torch.testing.assert_close(lazy_losses, eager_losses, rtol=1e-12, atol=1e-12)
    for name, p in eager_params.items():
        torch.testing.assert_close(lazy_params[name], p, rtol=1e-12, atol=1e-12, msg=name)

    # the minifier shrinks the case to the flipped op, as a script that reproduces it alone
    case = sorted(glob.glob(str(injected / "dumps" / "*.case.pt")))[0]
    script = minify.minify_case(case, str(injected / "repro.py"), imports=["miscompile_injection"], log=lambda _: None)
    source = open(script).read()
    graph = source.split('"""')[1]
    assert graph.count("torch.ops.aten.") == 1 and "torch.ops.aten.sub.Tensor" in graph, graph
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1 and "MISMATCH" in run.stdout, run.stdout + run.stderr


def test_a_miscompile_in_the_mlir_passes_is_found_and_shrunk(injected_in_mlir, checking):
    """The same defect made by the MLIR stage: the checker names that stage,
    and the minifier shrinks ts_to_fx's graph of the group, taking each
    trial through the passes and back, to the flipped op."""
    lazy_mlir.native._C.clear_computation_cache()
    eager_losses, _ = _train(CPU)
    with pytest.warns(RuntimeWarning, match="disagrees with TorchScript") as caught:
        lazy_losses, _ = _train(LAZY)
    text = next(str(w.message) for w in caught if "disagrees" in str(w.message))
    assert "stage at fault: mlir" in text, text
    torch.testing.assert_close(lazy_losses, eager_losses, rtol=1e-12, atol=1e-12)

    case = sorted(glob.glob(str(injected_in_mlir / "dumps" / "*.case.pt")))[0]
    script = minify.minify_case(case, str(injected_in_mlir / "repro.py"), imports=["mlir_miscompile_injection"],
                                log=lambda _: None)
    graph = open(script).read().split('"""')[1]
    # the subtraction, and the read of its alpha (ts_to_fx's graphs take Python numbers as 0-d tensors)
    ops = graph.count("torch.ops.aten.") - graph.count("torch.ops.aten.ScalarImplicit")
    assert ops == 1 and "torch.ops.aten.sub.Tensor" in graph, graph
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1 and "MISMATCH" in run.stdout, run.stdout + run.stderr


def _trained_without_false_alarm(model, opt, batches) -> None:
    """Trains ``model`` (on the lazy device) on ``batches`` of (x, y) under
    the checker: every new code agreed and ran, none fell back."""
    lazy_mlir.native._C.clear_computation_cache()
    steps = 0
    for x, y in batches:
        model(x.to(LAZY), y.to(LAZY)).backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        steps += 1
    s = metrics.snapshot()
    assert s["checks_passed"] >= 1 and s["checks_mismatched"] == 0, metrics.report()
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] >= steps, metrics.report()


def test_correct_float32_adam_code_passes_the_check(checking):
    """No false alarm on float32 AdamW (GPT): where a gradient is rounding
    noise, Adam's first update (g / sqrt(g^2)) is too, in any correct code:
    the check measures that noise floor (inputs moved by a few ulps)."""
    torch.manual_seed(0)
    model = make_gpt(SMALL_GPT).to(LAZY)
    _trained_without_false_alarm(model, make_adamw(model), gpt_batches(SMALL_GPT, 3))


def test_tolerance_follows_the_least_precise_dtype():
    from lazy_mlir.run import numerics_check
    a = torch.ones(4, dtype=torch.float64)
    near = a + 1e-7  # float32 rounding: beyond float64's tolerance, within float32's
    assert numerics_check.compare_values([near], [a], numerics_check.TOLERANCES[torch.float64])
    assert not numerics_check.compare_values([near], [a], numerics_check.TOLERANCES[torch.float32])
    # within ten times the output's noise floor: rounding, whatever the dtype
    assert not numerics_check.compare_values([a + 1e-3], [a], numerics_check.TOLERANCES[torch.float64], [1e-3])
    nan = torch.tensor([float("nan"), 1.0])
    assert not numerics_check.compare_values([nan.clone()], [nan], numerics_check.TOLERANCES[torch.float32])
    assert numerics_check.compare_values([torch.tensor([1.0, 1.0])], [nan], numerics_check.TOLERANCES[torch.float32])
    assert numerics_check.compare_values([torch.tensor([1, 2])], [torch.tensor([1, 3])], (1.0, 1.0))


class _Float32Softmax(nn.Module):
    """A float64 model that computes a softmax in float32 (as ViT's and
    Llama's eager attention do), with a shift ``b`` the softmax cancels: its
    gradient is float32 rounding alone, which AdamW's first update turns
    into a full step."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def forward(self, x, y):
        p = torch.softmax((x @ self.w + self.b).float(), dim=-1).double()
        return ((p - y) ** 2).sum()


def test_a_float64_group_computing_in_float32_passes_the_check(checking):
    """No false alarm where a float64 group casts to float32 inside: its
    noise floor is measured by moving the inputs by float32's ulps (float64's
    would be absorbed by the cast), and its tolerance is float32's. ``b``'s
    update is rounding of either sign: the first move may leave it as it
    was, and the difference is held against more moves before it counts."""
    torch.manual_seed(0)
    model = _Float32Softmax().to(LAZY)
    batches = [(torch.randn(32, 16, dtype=torch.float64), torch.rand(32, 8, dtype=torch.float64)) for _ in range(2)]
    _trained_without_false_alarm(model, torch.optim.AdamW(model.parameters(), lr=1e-2), batches)


def test_the_dtype_a_group_computes_in_is_read_from_its_casts():
    """LTC types a group's values as plain Tensor: the dtype comes from the
    tensors it is given and the dtype arguments of its casts."""
    from lazy_mlir.run import numerics_check
    graph = torch._C.parse_ir("""graph(%x : Tensor):
      %float32 : int = prim::Constant[value=6]()
      %false : bool = prim::Constant[value=0]()
      %none : NoneType = prim::Constant()
      %y : Tensor = aten::_to_copy(%x, %float32, %none, %none, %none, %false, %none)
      return (%y)""")
    x = torch.ones(3, dtype=torch.float64)
    assert numerics_check.graph_float(graph, [x]) == torch.float32
    assert numerics_check.graph_tolerance(graph, [x]) == numerics_check.TOLERANCES[torch.float32]
    moved = numerics_check.perturbed([x], torch.float32)[0]
    assert (moved - x).abs().max() > torch.finfo(torch.float32).eps  # float32's ulps, not float64's


def test_a_steps_python_numbers_are_not_moved():
    """0-d inputs are the step's Python numbers (exact): moving pow's
    exponent 1 would make every negative base NaN and the floor nothing."""
    from lazy_mlir.run import numerics_check
    x, exponent = torch.randn(4, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    moved_x, moved_exponent = numerics_check.perturbed([x, exponent])
    assert torch.equal(moved_exponent, exponent) and not torch.equal(moved_x, x)


def test_a_difference_is_held_against_more_moves_before_it_counts():
    """A value that is rounding alone (an Adam step of either sign) may stay
    put under the first move: the difference counts only if no later move
    moves the reference as far."""
    from lazy_mlir.run import numerics_check
    x = torch.randn(8, dtype=torch.float64)
    reference = [torch.tensor([0.01])]
    moves = iter([[0.0101], [0.0102], [-0.0099]])  # the third move flips the sign

    def run_reference(moved):
        return [torch.tensor(next(moves))]

    def differing(floors):
        return numerics_check.compare_values([torch.tensor([-0.01])], reference, (1e-4, 1e-6), floors)

    found, floors = numerics_check.differences_beyond_noise([x], reference, run_reference, torch.float32, differing)
    assert found == [] and floors[0] > 0.019
    moves = iter([[0.0101]] * (numerics_check.CONFIRMING_MOVES + 1))  # never flips: a real difference
    found, _ = numerics_check.differences_beyond_noise([x], reference, run_reference, torch.float32, differing)
    assert [k for k, _, _ in found] == [0]
