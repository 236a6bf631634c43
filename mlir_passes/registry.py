"""Passes by pipeline flag. Every module of this package is imported on the
first lookup, so a new pass only needs its own file ``<flag with _>.py``
holding a ``@register``-ed class."""
from __future__ import annotations

import importlib
import pkgutil

from .base import Pass, PipelineError

_passes: dict[str, type[Pass]] = {}
_loaded = False


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    module_stem = cls.__module__.rsplit(".", 1)[-1]
    if module_stem != cls.name.replace("-", "_"):
        raise ValueError(f"pass {cls.name!r} must live in a file named {cls.name.replace('-', '_')}.py, "
                         f"not {module_stem}.py")
    if _passes.get(cls.name, cls) is not cls:
        raise ValueError(f"two passes named {cls.name!r}: {_passes[cls.name].__qualname__} and {cls.__qualname__}")
    _passes[cls.name] = cls
    return cls


def get_pass(flag: str) -> type[Pass]:
    """The pass class for ``flag``; PipelineError listing the known flags otherwise."""
    _load_all()
    if flag not in _passes:
        raise PipelineError(f"unknown pass {flag!r}; known passes: {', '.join(available_passes())}")
    return _passes[flag]


def available_passes() -> list[str]:
    """The flags of all registered passes, sorted."""
    _load_all()
    return sorted(_passes)


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    _loaded = True
