"""Which way a group's new code is compiled: the one policy, the routes beside it.

A group whose inputs no cached code serves compiles by one route, the first
of these that applies:

========== ============================================================ ==========================
route      what happens                                                 where (switch)
========== ============================================================ ==========================
WAIT       its family's shape-generic code is compiling in the           ``background``
           background already: TorchScript until it lands
BACKGROUND shape-generic code, planned from the sizes seen, compiles     ``background``
           on the background thread; TorchScript meanwhile (O1)          (``background_compile``)
GENERIC    the same shape-generic code, compiled in the step             ``shape_generic``
DEFERRED   in its graph's first execution: a static compile left to the  ``parallel``
           graph's end, generated beside the other groups' (O1)          (``compile_workers``)
ISOLATED   the whole static compile in a worker process (CPU, C++        ``isolated``
           wrapper, native calls)                                        (``isolated_compile``)
IN_PROCESS lowered and generated here                                    ``lowering.group_lowering``
========== ============================================================ ==========================

A generic compile that fails falls back to the static routes in the step
(``static``); a worker that fails falls back to this process. The group's
executable (``run.executables``) follows the route chosen here.
"""
from __future__ import annotations

import dataclasses
import enum
import sys
import time
import warnings
from concurrent.futures import Future

import torch

from .. import config
from ..lowering import lowering_function
from ..lowering.errors import NoSymbolicShapes
from ..observe import metrics
from . import background, isolated, parallel, shape_generic

lower_group = lowering_function("lower_group")


class Route(enum.Enum):
    WAIT = "wait"
    BACKGROUND = "background"
    GENERIC = "generic"
    DEFERRED = "deferred"
    ISOLATED = "isolated"
    IN_PROCESS = "in_process"


@dataclasses.dataclass
class Choice:
    route: Route
    pending: Future | None = None  # WAIT: the family's compile running in the background
    planned: object | None = None  # BACKGROUND: shape_generic's plan


def choose(cfg: config.Config, name: str, inputs: list[torch.Tensor], sighting) -> Choice:
    """The route of group ``name``'s compile for ``inputs`` (``sighting``:
    shape_generic's record of the sizes the group was seen at, or None)."""
    planned = shape_generic.plan(sighting, inputs) if sighting is not None else None
    # in the background only where the step need not wait: not a size seen
    # in this very execution (its first, which compiles its other groups anyway)
    if (sighting is not None and cfg.background_compile and cfg.level == "O1"
            and not shape_generic.seen_in_this_execution(sighting)):
        pending = background.pending(sighting.family)
        if pending is not None:
            return Choice(Route.WAIT, pending=pending)
        if planned is not None:
            return Choice(Route.BACKGROUND, planned=planned)
    if planned is not None:
        return Choice(Route.GENERIC)  # planned again under the compile lock (compile_in_step)
    if parallel.applies(name, cfg):
        return Choice(Route.DEFERRED)
    return Choice(static(cfg, inputs))


def static(cfg: config.Config, inputs: list[torch.Tensor]) -> Route:
    """Where a static compile in the step runs."""
    return Route.ISOLATED if isolated.applies(cfg, inputs) else Route.IN_PROCESS


def compile_in_step(route: Route, graph: torch._C.Graph, inputs: list[torch.Tensor], name: str, cfg: config.Config,
                    sighting):
    """Routes GENERIC, ISOLATED and IN_PROCESS: the group's code, compiled
    now (raises what the compile raised)."""
    with background.compile_lock:  # after any compile running in the background
        lowered = None
        if route is Route.GENERIC:  # planned again: a background compile may have given the family up
            planned = shape_generic.plan(sighting, inputs)
            lowered = planned and compile_generic(graph, inputs, name, cfg, sighting, planned)
        if lowered is None and static(cfg, inputs) is Route.ISOLATED:
            lowered = isolated.lower(graph, inputs, name, cfg)  # None: the worker could not, lowered here
        return lowered or lower_group(graph, inputs, name, cfg)


def compile_generic(graph: torch._C.Graph, inputs: list[torch.Tensor], name: str, cfg: config.Config, sighting,
                    planned, in_background: bool = False):
    """Routes BACKGROUND and GENERIC: the shape-generic form planned by
    ``shape_generic.plan``; None (compile the static form) when it fails."""
    start = time.perf_counter()
    if cfg.progress and not in_background:
        print(f"lazy_mlir: {name} seen at other sizes: compiling it shape-generic", file=sys.stderr,
              flush=True)
    try:
        lowered = shape_generic.compile_generic(graph, inputs, name, cfg, sighting, planned)
    except NoSymbolicShapes as exc:  # known beforehand to be static: said where asked, not warned
        shape_generic.give_up(sighting.family, str(exc))
        if cfg.logs("recompiles") or cfg.logs("dynamic"):
            print(f"lazy_mlir: {name} compiles static: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # noqa: BLE001 - the static form is always there to fall back on
        shape_generic.give_up(sighting.family)
        metrics.count_cache("generic_failed")
        warnings.warn(f"lazy_mlir: fusion group {name} could not be compiled shape-generic "
                      f"({type(exc).__name__}: {exc}); compiling it for these sizes only", RuntimeWarning,
                      stacklevel=1)
        return None
    metrics.count_cache("generic_compile")
    if cfg.progress and in_background:
        print(f"lazy_mlir: {name} compiled shape-generic in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    return lowered
