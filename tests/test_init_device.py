"""init(device=...): which device backs torch.device("lazy"). The TorchScript
backend reads LTC_TS_CUDA once, when it is created, so a fresh process shows
what init() set; in this process the device is already fixed (CPU here)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lazy_mlir
from lazy_mlir import config

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def run_fresh(script: str, **env) -> str:
    """Runs ``script`` in a new Python process; returns its last stdout line."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@no_gpu
def test_cuda_without_a_gpu_is_a_clear_error(lazy_level):
    before = config.current
    with pytest.raises(RuntimeError, match=r"device='cuda', but this torch is a CPU build .*use device='cpu'"):
        lazy_mlir.init(device="cuda")
    assert config.current is before


def test_an_unknown_pass_is_refused_at_init(lazy_level):
    """The pipeline is checked at init() (its flags against the package's
    modules), not at the first compile."""
    before = config.current
    with pytest.raises(Exception, match="unknown pass 'nope'; known passes: canonicalize, cse"):
        lazy_mlir.init(pipeline="cse,nope")
    assert config.current is before


def test_unknown_device_is_refused(lazy_level):
    with pytest.raises(ValueError, match=r"device must be one of \('cpu', 'cuda'\), got 'tpu'"):
        lazy_mlir.init(device="tpu")


@no_gpu
def test_the_default_here_is_the_cpu(lazy_level):
    assert config.Config().device == "cpu" and config.current.device == "cpu"
    assert torch._C._lazy._get_default_device_type() == "CPU"


def test_another_device_in_the_same_process_is_refused(lazy_level, monkeypatch):
    backing = config.current.device
    other = "cuda" if backing == "cpu" else "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # passes validation without a GPU
    before = config.current
    with pytest.raises(RuntimeError, match=f"already backed by {backing}.*use device='{backing}' or a new process"):
        lazy_mlir.init(device=other)
    assert config.current is before


def test_init_cuda_sets_the_ts_backend_switch_first():
    # Pretends a GPU is there: the backend is created for CUDA without touching one.
    line = run_fresh("""
        import os, torch
        torch.cuda.is_available = lambda: True
        import lazy_mlir
        cfg = lazy_mlir.init(device="cuda")
        print(torch._C._lazy._get_default_device_type(), os.environ.get("LTC_TS_CUDA"), cfg.device)
        """)
    assert line == "CUDA 1 cuda"


@no_gpu
def test_init_cpu_clears_a_stray_switch_and_the_env_var_picks_the_default():
    # LTC_TS_CUDA selects CUDA by its mere presence, "0" included.
    line = run_fresh("""
        import os, torch, lazy_mlir
        cfg = lazy_mlir.init()
        print(torch._C._lazy._get_default_device_type(), "LTC_TS_CUDA" in os.environ, cfg.device)
        """, LTC_TS_CUDA="0", LAZY_MLIR_DEVICE="cpu")
    assert line == "CPU False cpu"


@pytest.mark.python_wrapper
def test_importing_lazy_mlir_leaves_the_compiler_to_the_first_compile():
    """A process that only imports lazy_mlir (an eager baseline reading
    lazy_mlir.models, a script that never calls init()) loads no compiler,
    and init() none either: torch-mlir's MLIR libraries, the lowering and
    Inductor's compiler come with the first group compiled (a process whose
    groups all come from the cache never loads them: test_cpp_wrapper), and
    lazy_mlir.zero (torch.distributed's collectives, MLIR) on first use."""
    heavy = ["torch_mlir.ir", "sympy", "torch._dynamo", "torch._inductor.compile_fx", "lazy_mlir.lowering.group_lowering",
             "mlir_passes.pipeline", "lazy_mlir.zero"]
    out = run_fresh(f"""
        import json, sys, torch, lazy_mlir
        from lazy_mlir.models import make_gpt
        loaded = lambda: [m for m in {heavy!r} if m in sys.modules]
        before = loaded()
        lazy_mlir.init()
        after_init = loaded()
        y = (torch.ones(3, 5).to("lazy") * 2).sum(0)
        torch._lazy.mark_step()
        y.cpu()
        after_compile = loaded()
        lazy_mlir.zero.initialize  # on first use
        print(json.dumps([before, after_init, after_compile, loaded()]))
    """, LAZY_MLIR_CACHE="0")
    before, after_init, after_compile, after_zero = json.loads(out)
    assert before == [], f"import lazy_mlir loaded {before}"
    assert after_init == [], f"init() loaded {after_init}"
    assert {"torch_mlir.ir", "lazy_mlir.lowering.group_lowering", "torch._inductor.compile_fx"} <= set(after_compile)
    assert "lazy_mlir.zero" in after_zero
