"""MLIR passes of lazy_mlir: one file per pass, named after its pipeline flag
(``fold_copy_ops.py`` for ``fold-copy-ops``), a registry and a pipeline
builder. Shipped as its own top-level package beside ``lazy_mlir``.

    import mlir_passes
    mlir_passes.run_pipeline(module, mlir_passes.DEFAULT_PIPELINE)
"""
import functools
import hashlib
import importlib
import importlib.metadata
import os
import re

# What the compiler runs on every imported group. cse merges the constants
# the rewrites add. canonicalize is left out: it folds constant-shaped
# aten.zeros/ones into torch.vtensor.literal, which has no ATen op to export
# to FX (tests/mlir/canonicalize.mlir).
DEFAULT_PIPELINE = "fold-copy-ops,scalar-implicit-to-tensor,specialize-scalars,cse"

__all__ = ["DEFAULT_PIPELINE", "light_pipeline_id", "Pass", "PassError", "PipelineError", "available_passes", "get_pass",
           "parse_pipeline", "pipeline_id", "register", "run_pipeline"]

# Where each name lives: importing them loads MLIR's libraries (~40 MB), which
# the package import leaves to their first use (DEFAULT_PIPELINE needs none).
_HOMES = {"Pass": "base", "PassError": "base", "PipelineError": "base", "parse_pipeline": "pipeline",
          "pipeline_id": "pipeline", "run_pipeline": "pipeline", "available_passes": "registry",
          "get_pass": "registry", "register": "registry"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_PLAIN_PIPELINE = re.compile(r"[\w-]+(,[\w-]+)*")


@functools.cache
def light_pipeline_id(spec: str) -> str | None:
    """A cache-key id of ``spec`` read from this package's files, without
    importing MLIR (a training process that only loads cached code never
    needs it): the spec, torch-mlir's version and every module's source, so
    that editing any pass changes it. None when the spec has options or a
    flag no module here is named after (a pass registered from elsewhere):
    then ``pipeline_id`` parses it."""
    spec = spec.replace(" ", "")
    if spec and not _PLAIN_PIPELINE.fullmatch(spec):
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    sources = {}
    for name in sorted(f for f in os.listdir(here) if f.endswith(".py")):
        with open(os.path.join(here, name), "rb") as f:
            sources[name] = f.read()
    for flag in filter(None, spec.split(",")):
        # registry.register: the pass of a flag lives in the module named after it
        if f'name = "{flag}"'.encode() not in sources.get(f"{flag.replace('-', '_')}.py", b""):
            return None
    digest = hashlib.sha256(f"{spec}|torch-mlir {importlib.metadata.version('torch-mlir')}".encode())
    for name, source in sources.items():
        digest.update(name.encode() + b"\0" + source)
    return digest.hexdigest()[:16]
