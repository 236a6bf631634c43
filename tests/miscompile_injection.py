"""Imported by tests/test_numerics_check.py (and by the minifier's worker and
reproducer there) to inject a miscompile: Inductor lowers ``aten.sub.Tensor``
as an add. Only with an Inductor cache folder of the test's own: the wrong
code must never be served to anything else."""
import os

import torch
from torch._inductor import lowering

assert os.environ.get("TORCHINDUCTOR_CACHE_DIR", "").startswith(os.environ.get("MISCOMPILE_INJECTION_DIR", "?")), \
    "the injected miscompile needs an Inductor cache folder of its own"
aten = torch.ops.aten
lowering.lowerings[aten.sub.Tensor] = lowering.lowerings[aten.add.Tensor]
