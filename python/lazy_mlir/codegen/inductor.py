"""Inductor code generation for one fusion group (C++ on CPU, Triton on GPU).

The graph is compiled with the converter's fake tensors under a
TracingContext of the same FakeTensorMode: Inductor then takes its FX-graph
and AOT caches (a warm compile ~2 s instead of ~20 s); compiling on real
tensors bypasses them ("No shape env").
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode


def compile_graph(gm: fx.GraphModule, fake_inputs: list, fake_mode: FakeTensorMode, name: str):
    """Returns (callable list[Tensor] -> list[Tensor], generated source).
    ``fake_inputs`` carry the real inputs' shapes, dtypes and strides."""
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.compile_fx import compile_fx

    loaded_before = set(PyCodeCache.modules)
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)), torch.no_grad():
        compiled = compile_fx(gm, fake_inputs)
    new_modules = [m for m in PyCodeCache.modules if m not in loaded_before]
    code = "\n\n".join(_source_of(m) for m in new_modules) or "# (served from Inductor's cache)"

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(compiled(*inputs))

    return run, code


def _source_of(module) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    with open(path) as f:
        return f"# {path}\n" + f.read()
