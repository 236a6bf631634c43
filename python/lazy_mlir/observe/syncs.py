"""Where a step is cut into more than one graph execution, and why.

Two things cut a step: an op that takes the eager path (it runs on the CPU,
so the graph traced so far executes first), and Python reading a value
mid-step (``.item()``, ``bool(t)``, ``t.all()`` in an ``if``: Hugging Face's
masking utilities do this). The C++ backend calls ``on_execute`` before every
graph execution: one whose Python caller is not ``mark_step`` is a sync. The
eager kernels call ``eager_fallback``.
Both are counted in the metrics by the user's source line. At O2, which
promises one graph per step, an eager fallback is an error naming the op and
the line (``init(o2_fallback="warn")`` makes it a warning), and a value read
warns once per line.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings

import torch

from .. import config
from . import metrics

# Frames in these directories are ours or torch's, never the user's line.
# torch and the whole lazy_mlir package (this file is in lazy_mlir/observe/)
INTERNAL_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)


class EagerFallbackError(RuntimeError):
    """O2: an op would run eagerly, cutting the step into several graphs."""


# Executions under mark_step run the step on purpose (and so do lazy_mlir's setup graphs).
_STEP_CODES = {torch._lazy.mark_step.__code__}


def count_as_step(function) -> None:
    """Executions under ``function`` are on purpose, not value reads."""
    _STEP_CODES.add(function.__code__)


def _is_user_frame(frame) -> bool:
    filename = frame.f_code.co_filename
    return not filename.startswith(INTERNAL_DIRS) and not filename.startswith("<")


def _describe(frame, line: int | None = None) -> str:
    return f"{frame.f_code.co_filename}:{line or frame.f_lineno} ({frame.f_code.co_name})"


def user_source() -> str:
    """'file.py:12 (forward)' of the innermost frame outside torch and lazy_mlir."""
    frame = sys._getframe(1)
    while frame is not None and not _is_user_frame(frame):
        frame = frame.f_back
    return _describe(frame) if frame is not None else "source line unknown"


def user_stacklevel() -> int:
    """warnings.warn's stacklevel, for a warning raised by this function's
    caller, that names the innermost frame outside torch and lazy_mlir."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and not _is_user_frame(frame):
        frame, level = frame.f_back, level + 1
    return level


def user_source_of(tb) -> str:
    """The same for where an exception was raised: the innermost user frame of its traceback."""
    found = None
    while tb is not None:
        if _is_user_frame(tb.tb_frame):
            found = _describe(tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return found or "source line unknown"


def eager_fallback(op_name: str) -> None:
    """One of our kernels is about to run ``op_name`` on the CPU."""
    source = user_source()
    metrics.count_fallback(op_name, source)
    if config.current.level == "O2":
        _o2_fallback(f"{op_name} at {source} has no lazy kernel and would run eagerly")


def _o2_fallback(what: str) -> None:
    message = f"lazy_mlir O2: {what}, cutting the step into several graph executions"
    if config.current.o2_fallback == "warn":
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return
    raise EagerFallbackError(message + '; use level="O1", or init(o2_fallback="warn") to run it anyway')


_ltc_fallbacks_seen = 0


def _check_ltc_fallbacks(source: str) -> None:
    """O2: LTC's own kernels that run eagerly (``nonzero``: data-dependent
    shapes) bypass ours; its counters show them at the next execution. Only
    a warning: an exception raised inside an LTC execution aborts the process."""
    global _ltc_fallbacks_seen
    counts = metrics.ltc_fallback_counts()
    total = sum(counts.values())
    if total > _ltc_fallbacks_seen:
        _warn_in_execution(f"lazy_mlir O2: LTC ran {', '.join(sorted(counts))} eagerly (noticed at {source}), "
                           "cutting the step into several graph executions", stacklevel=3)
    _ltc_fallbacks_seen = total  # also after metrics.reset()


_deferred: list[Warning] = []  # warnings raised as errors inside an execution, for the next mark_step


def _warn_in_execution(message: str, stacklevel: int) -> None:
    """A RuntimeWarning from inside a graph execution (on_execute runs within
    LTC's sync). Where the user's filter makes it an error (-W error), it is
    not raised there: LTC keeps what a sync throws and rethrows it at the
    next sync, and a Python error rethrown twice aborts the process. The
    next mark_step raises it instead, before it syncs anything."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    except Warning as error:
        _deferred.append(error)


@contextlib.contextmanager
def deferring_warnings():
    """Around code that runs inside a graph execution and may warn (a
    group's compile: Inductor's deprecations, our fallback notices). Where a
    filter makes some warning an error (-W error), its warnings are recorded
    and emitted again after it, those the filters raise waiting for the next
    mark_step (see _warn_in_execution); else nothing changes (catch_warnings
    swaps process-wide state, which background compile threads share)."""
    if not any(f[0] == "error" for f in warnings.filters):
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        try:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        except Warning as error:
            _deferred.append(error)


def raise_deferred() -> None:
    """Raises the first warning an execution raised as an error since the
    last call (step_errors' mark_step calls this first)."""
    if _deferred:
        error = _deferred[0]
        _deferred.clear()
        raise error


_planned: list[str] = []  # what lazy_mlir's own reads in progress read (planned_read)


@contextlib.contextmanager
def planned_read(what: str):
    """Around a read that lazy_mlir makes (moe_experts'): its execution is
    counted and warned about as a value read, under ``what`` and the user's line."""
    _planned.append(what)
    try:
        yield
    finally:
        _planned.pop()


_at_mark_step: list = []  # callbacks run as mark_step's execution starts


def at_mark_step(callback) -> None:
    """Run ``callback()`` as each mark_step's graph execution starts (what a
    step kept for itself, such as data_dependent's counts, is let go)."""
    _at_mark_step.append(callback)


_warned: set[str] = set()
execution = 0  # serial number of the graph execution running now (or last), never reset


def on_execute(draws: bool = False, host_draws: bool = False) -> bool:
    """Before a graph execution. From mark_step: nothing to say. From any other
    Python code: a value was read mid-step (or an op fell back to the CPU,
    which reads its inputs).
    ``draws``: the graph runs random ops (dropout's bernoulli...): read
    mid-step, they warn (see ``_warn_redraw``).
    ``host_draws``: it draws after the host used the CPU generator mid-step
    (see ``_warn_host_draws``).
    Returns True under mark_step: its sync takes every pending graph, which
    buffer donation relies on (lazy_backend/memory/buffer_donation.h)."""
    global execution
    execution += 1
    frame, user, marking = sys._getframe(0).f_back, None, False
    while frame is not None and not marking:
        marking = frame.f_code in _STEP_CODES
        if user is None and _is_user_frame(frame):
            user = frame
        frame = frame.f_back
    source = _describe(user) if user is not None else "source line unknown"
    if _planned and not marking:
        source = f"{_planned[-1]}, at {source}"
    if config.current.level == "O2":
        _check_ltc_fallbacks(source)
    if host_draws:
        _warn_host_draws()
    if marking:
        for callback in _at_mark_step:
            callback()
    if marking or user is None:
        return marking
    metrics.count_sync(source)
    if draws:
        _warn_redraw(source)
    if config.current.level == "O2" and source not in _warned:
        _warned.add(source)
        _warn_in_execution(f"lazy_mlir O2: a value read at {source} executed the step traced so far as a graph "
                           "of its own: the step takes more than one graph execution", stacklevel=2)
    return False


_warned_redraw: set[str] = set()
_warned_host_draws: set[str] = set()


def _warn_host_draws() -> None:
    """The step's draws run after the host used the CPU generator
    (lazy_backend/ltc_fixes/host_generator.h). Once per source line (of the
    mark_step or the read that runs them)."""
    source = user_source()
    if source in _warned_host_draws:
        return
    _warned_host_draws.add(source)
    _warn_in_execution(f"lazy_mlir: the graph run at {source} draws random numbers (dropout...) on the CPU "
                       "generator, which the host used after the step's first draw was traced (torch.rand, randint "
                       "or randperm on the host, an op run eagerly that draws, torch.manual_seed or set_rng_state "
                       "mid-step). The lazy draws take their numbers when the graph runs, so the step's draws "
                       "differ from eager PyTorch's (equally random). To match eager, draw on the host before the "
                       "step's first draw or after mark_step(); metrics: draws_after_host_use", stacklevel=user_stacklevel())


def _warn_redraw(source: str) -> None:
    """A read mid-step ran random ops (not ``item()`` nor an eager fallback:
    they sync every live tensor first, lazy_backend/ltc_fixes/value_reads.h). LTC
    computes only the tensors read;
    what else depends on the draws (the activations and masks saved for
    backward, the gradients) stays pending and draws again, other numbers,
    when the step's graph runs: it no longer matches the value read, nor
    eager PyTorch's step. Once per source line."""
    if source in _warned_redraw:
        return
    _warned_redraw.add(source)
    _warn_in_execution(f"lazy_mlir: a value read at {source} ran random ops (dropout...) in a graph of its own; "
                       "the tensors that still depend on them (saved activations, gradients) draw again when the "
                       "step's graph runs, so they see other random numbers than the value read and than eager "
                       "PyTorch. Read values after mark_step() to keep eager's draws", stacklevel=3)


def short_source(source: str) -> str:
    """LTC's "<file> <function> <line>" as 'file:line (function)'."""
    parts = source.rsplit(" ", 2)
    if len(parts) != 3:
        return source
    return f"{parts[0]}:{parts[2]} ({parts[1]})"
