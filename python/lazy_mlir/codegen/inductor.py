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
    """Returns a callable list[Tensor] -> list[Tensor]. ``fake_inputs`` carry
    the real inputs' shapes, dtypes and strides."""
    from torch._inductor.compile_fx import compile_fx

    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)), torch.no_grad():
        compiled = compile_fx(gm, fake_inputs)

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(compiled(*inputs))

    return run
