"""What every pass is: a small immutable object with a flag, typed options
and one ``apply(module)``, identified for cache keys by a hash of its source.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import pathlib
import sys
import types
import typing
from typing import ClassVar

from torch_mlir import passmanager


class PassError(Exception):
    """A pass met input it does not handle (the message names the op)."""


class PipelineError(ValueError):
    """A pipeline spec names an unknown pass or option, or a bad option value."""


@dataclasses.dataclass(frozen=True)
class Pass:
    """Base of all passes; subclasses are frozen dataclasses whose fields are
    the pass options and whose docstring is the pass description."""

    name: ClassVar[str]

    def apply(self, module) -> None:
        """Rewrite ``module`` (an ``ir.Module`` or its ``builtin.module`` op) in place."""
        raise NotImplementedError

    @classmethod
    def description(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def option_types(cls) -> dict[str, type]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    def options(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def spec(self, separator: str = ",") -> str:
        """This pass as a pipeline element: ``name`` or ``name{opt=value,...}``."""
        opts = separator.join(f"{k.replace('_', '-')}={format_option(v)}" for k, v in self.options().items())
        return f"{self.name}{{{opts}}}" if opts else self.name

    def pass_id(self) -> str:
        """Stable id for cache keys: changes with the code the pass runs or its options."""
        digest = hashlib.sha256(_code_fingerprint(type(self)).encode())
        digest.update(self.spec().encode())
        return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class MlirPass(Pass):
    """A pass built into MLIR/torch-mlir, run by its textual pipeline name."""

    def pipeline_text(self) -> str:
        return self.spec(separator=" ")  # MLIR separates options by spaces

    def apply(self, module) -> None:
        op = module.operation
        with op.context:
            pass_manager = passmanager.PassManager()
            pass_manager.add(self.pipeline_text())
            pass_manager.run(op)

    def pass_id(self) -> str:
        # Its behaviour lives in the torch-mlir binary: key on that version too.
        version = importlib.metadata.version("torch-mlir")
        return hashlib.sha256(f"{super().pass_id()} torch-mlir {version}".encode()).hexdigest()[:16]


def format_option(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@functools.cache
def _code_fingerprint(cls: type) -> str:
    """Hash of the source files of ``cls``'s module and of every module of this
    package it uses, directly or not (helpers included)."""
    seen: set[str] = set()
    pending = [c.__module__ for c in cls.__mro__]
    while pending:
        name = pending.pop()
        if name in seen or not name.startswith(__package__ + "."):
            continue
        seen.add(name)
        for value in vars(sys.modules[name]).values():
            used = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(used, str):
                pending.append(used)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(pathlib.Path(sys.modules[name].__file__).read_bytes())
    return digest.hexdigest()
