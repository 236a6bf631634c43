"""Executables bound into CompiledGroup: callables list[Tensor] -> list[Tensor].

TorchScriptExecutable runs the group's own TorchScript subgraph; the MLIR
codegen backends plug in beside it.
"""
from __future__ import annotations

import torch


class TorchScriptExecutable:
    """Runs a fusion group's subgraph with the TorchScript graph executor."""

    def __init__(self, graph: torch._C.Graph, name: str):
        graph = graph.copy()
        outputs = list(graph.outputs())
        self.num_outputs = len(outputs)
        if self.num_outputs != 1:
            # A TorchScript function returns one value: pack several in a tuple.
            for _ in outputs:
                graph.eraseOutput(0)
            tup = graph.create("prim::TupleConstruct", outputs)
            tup.output().setType(torch._C.TupleType([v.type() for v in outputs]))
            tup.insertBefore(graph.return_node())
            graph.registerOutput(tup.output())
        self.function = torch._C._create_function_from_graph(name.replace(".", "_"), graph)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = self.function(*inputs)
        return [out] if self.num_outputs == 1 else list(out)
