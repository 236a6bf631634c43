"""Imported by tests/test_numerics_check.py (and by the minifier's worker and
reproducer there) to inject a miscompile into the MLIR stage: after the
passes, every ``torch.aten.sub.Tensor`` becomes an add. Only with a dump
folder of the test's own in the environment: nothing else may be lowered
with it."""
import os

import mlir_passes
from mlir_passes import torch_ir

assert os.environ.get("MISCOMPILE_INJECTION_DIR"), "the injected miscompile needs a test folder of its own"
_run_pipeline = mlir_passes.run_pipeline


def _flipped(module, spec, **kwargs):
    _run_pipeline(module, spec, **kwargs)
    with module.operation.context:
        for op in torch_ir.ops_of(module):
            if op.operation.name == "torch.aten.sub.Tensor":
                operands = list(op.operation.operands)
                added = torch_ir.create_aten("add.Tensor", operands, [r.type for r in op.operation.results], op)
                torch_ir.replace_op(op, added.results)


mlir_passes.run_pipeline = _flipped
