"""Textual pipelines, ``"fold-copy-ops,canonicalize{max-iterations=3},cse"``:
parsing, running and identifying them.

Python passes and MLIR's own passes run in ONE torch_mlir PassManager
(``PassManager.add(callable)`` next to ``PassManager.add("cse")``), so the
verifier runs after each pass and nothing is re-parsed between them.
"""
from __future__ import annotations

import hashlib
import re
from typing import Callable

from torch_mlir import ir, passmanager

from .base import MlirPass, Pass, PipelineError
from .registry import get_pass

_ELEMENT = re.compile(r"\s*([\w-]+)\s*(?:\{(.*)\})?\s*", re.S)
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


def parse_pipeline(spec: str) -> list[Pass]:
    """The passes of ``spec``: flags separated by top-level commas, each with
    optional ``{opt=value,...}`` options (commas or spaces between them)."""
    if not spec.strip():
        return []
    passes = []
    for element in _split_top_level(spec):
        match = _ELEMENT.fullmatch(element)
        if not match:
            raise PipelineError(f"bad pipeline element {element!r} in {spec!r}; "
                                "expected flag or flag{option=value,...}")
        flag, options = match.groups()
        cls = get_pass(flag)
        passes.append(cls(**_parse_options(cls, options or "")))
    return passes


def run_pipeline(module, spec: str, *, on_pass_done: Callable[[str, object], None] | None = None) -> None:
    """Run ``spec`` on ``module`` (an ``ir.Module`` or ``builtin.module`` op)
    in place; ``on_pass_done(flag, module)`` is called after each pass.

    An exception raised by a Python pass (or by ``on_pass_done``) is re-raised
    as is; a failing MLIR pass or verifier raises ``ir.MLIRError``.
    """
    op = module.operation
    errors: list[Exception] = []
    with op.context:
        pass_manager = passmanager.PassManager()
        for p in parse_pipeline(spec):
            if isinstance(p, MlirPass):
                pass_manager.add(p.pipeline_text())
            else:
                _add_python_pass(pass_manager, p.name, p.apply, errors)
            if on_pass_done is not None:
                _add_python_pass(pass_manager, f"{p.name}-done",
                                 lambda _, name=p.name: on_pass_done(name, module), errors)
        try:
            pass_manager.run(op)
        except ir.MLIRError:
            if errors:
                raise errors[0] from None
            raise


def pipeline_id(spec: str) -> str:
    """Stable id of a whole pipeline for cache keys (its passes' ids, in order)."""
    ids = "\n".join(p.pass_id() for p in parse_pipeline(spec))
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


def _add_python_pass(pass_manager, name: str, run: Callable, errors: list) -> None:
    # Exceptions are stored, not left to unwind through MLIR's C++ frames; the
    # pass signals failure instead and run_pipeline re-raises them.
    def external_pass(op, pass_):
        try:
            run(op)
        except Exception as exc:  # noqa: BLE001 - re-raised by run_pipeline
            errors.append(exc)
            pass_.signal_pass_failure()

    pass_manager.add(external_pass, name=name)


def _split_top_level(spec: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            break
        if char == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    if depth != 0:
        raise PipelineError(f"unbalanced braces in pipeline {spec!r}")
    return parts + [spec[start:]]


def _parse_options(cls: type[Pass], text: str) -> dict[str, object]:
    types = cls.option_types()
    known = ", ".join(f"{k.replace('_', '-')} ({t.__name__})" for k, t in types.items()) or "none"
    options = {}
    for item in filter(None, re.split(r"[,\s]+", text.strip())):
        key, _, value = item.partition("=")
        field = key.replace("-", "_")
        if field not in types or not value:
            raise PipelineError(f"pass {cls.name!r}: bad option {item!r}; its options: {known}")
        options[field] = _convert(cls.name, key, value, types[field])
    return options


def _convert(flag: str, key: str, value: str, type_: type) -> object:
    try:
        if type_ is bool:
            return _BOOLS[value.lower()]
        return type_(value)
    except (KeyError, ValueError):
        raise PipelineError(f"pass {flag!r}: option {key} expects {type_.__name__}, got {value!r}") from None
