"""A fusion group per repeated layer (lazy_backend/core/layer_regions.h).

A model's repeated layers are the blocks of a ``ModuleList`` of one class
(a transformer's layers; not a CNN's ``Sequential`` stages, whose blocks
differ in width: docs/user-guide.md, "A fusion group per layer"). Hooks mark a boundary in
the trace where each block's forward starts and ends, and where the
gradients of its input and of its output are computed (its backward starts
and ends there); the clusterer then puts no two blocks' ops in one group.
Every block's groups are then the same code: compiled once, they serve
each block, and a model that skips blocks at random (LayerDrop) compiles no
group again for a new skip pattern. A fused optimizer step
(fused_optimizer) is cut the same way, one update per block: a skipped
block has no gradient, and its absence changes no other block's update.

``Config.layer_groups``: "auto" (the default) marks the layers of models
that skip them at random (a Hugging Face config with a ``*layerdrop`` above
0), "on" those of every model, "off" none. On a model that keeps its layers
it trades step time for compile time (benchmarks/layer_groups.py, 12 layers:
a 4-7x shorter cold compile, a 3-5% slower step): "auto" leaves such models
whole, and the first compile of a deep one says how to turn it on.
"""
from __future__ import annotations

import itertools
import sys
import weakref

import torch

from .. import config
from ..native import _C

_marked: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_block_of: dict[int, tuple[weakref.ref, int]] = {}  # id(parameter) -> (the parameter, its marked block's number)
_block_numbers = itertools.count()


def attach(model: torch.nn.Module) -> int:
    """Marks the boundaries of ``model``'s repeated layers as
    ``Config.layer_groups`` says; returns how many layers were marked."""
    global _deep_unmarked
    choice = config.current.layer_groups
    skips = skips_layers(model)
    if choice == "off" or (choice == "auto" and not skips):
        if choice == "auto":  # "off" was asked for: no hint
            _deep_unmarked = max([_deep_unmarked, *(len(layers) for layers in repeated_layers(model))])
        return 0
    count = 0
    for layers in repeated_layers(model):
        for layer in layers:
            if layer in _marked:
                continue
            layer.register_forward_pre_hook(_layer_starts, with_kwargs=True)
            layer.register_forward_hook(_layer_ends, with_kwargs=True)
            _marked.add(layer)
            number = next(_block_numbers)
            for p in layer.parameters():
                _block_of[id(p)] = weakref.ref(p), number
            count += 1
    if count and choice == "auto" and config.current.progress:
        print(f"lazy_mlir: {type(model).__name__} skips layers at random (LayerDrop): a fusion group per layer "
              f"of its {count} repeated layers (Config.layer_groups)", file=sys.stderr)
    return count


# Deep models that keep their layers: a hint at the first compile (print_compile_hint).
DEEP_LAYERS = 8
_deep_unmarked = 0  # the most repeated layers of a model left unmarked
_hinted = False


def print_compile_hint() -> None:
    """Once per process, at a compile's progress line, when a model with
    DEEP_LAYERS or more repeated layers was left whole: how a group per
    layer would shorten its cold compile."""
    global _hinted
    if _hinted or _deep_unmarked < DEEP_LAYERS or config.current.level == "O2":
        return
    _hinted = True
    print(f"lazy_mlir: the step compiles its {_deep_unmarked} repeated layers as one; layer_groups='on' "
          "(LAZY_MLIR_LAYER_GROUPS=1) compiles one layer's code for them all: at 12 layers a 4-7x shorter "
          "cold compile for a 3-5% slower step (docs/user-guide.md, \"A fusion group per layer\")", file=sys.stderr, flush=True)


def pieces(params: list[torch.Tensor]) -> list[list[int]]:
    """The indices of ``params`` cut where the marked layer a parameter
    belongs to changes (fused_optimizer's update per layer): runs of one
    block's parameters, and of parameters in none."""
    if not _block_of:
        return [list(range(len(params)))]
    result: list[list[int]] = []
    last = None
    for i, p in enumerate(params):
        entry = _block_of.get(id(p))
        block = entry[1] if entry is not None and entry[0]() is p else None
        if not result or block != last:
            result.append([])
        result[-1].append(i)
        last = block
    return result or [[]]


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The ModuleLists of ``model`` holding two or more blocks of one class."""
    return [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1
            and len({type(block) for block in m}) == 1]


def skips_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` drops layers at random: a Hugging Face config's
    ``layerdrop``, ``encoder_layerdrop`` or ``decoder_layerdrop`` above 0."""
    return _config_above_zero(model, lambda name: name.endswith("layerdrop"))


def _config_above_zero(model: torch.nn.Module, named) -> bool:
    """Whether a Hugging Face config field whose name ``named`` accepts holds a number above 0."""
    cfg = getattr(model, "config", None)
    return cfg is not None and any(named(name) and isinstance(value, (int, float)) and value > 0
                                   for name, value in vars(cfg).items())


def _first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, dict):  # a ModelOutput
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _mark(tensor: torch.Tensor | None) -> None:
    """A boundary now, and another when ``tensor``'s gradient is computed."""
    if tensor is None or tensor.device.type != "lazy":
        return
    _C.mark_layer_boundary()
    if tensor.requires_grad and torch.is_grad_enabled():
        tensor.register_hook(_gradient_computed)


def _gradient_computed(grad: torch.Tensor) -> None:
    _C.mark_layer_boundary()


def _layer_starts(module: torch.nn.Module, args, kwargs) -> None:
    _mark(_first_tensor(args) if args else _first_tensor(kwargs))


def _layer_ends(module: torch.nn.Module, args, kwargs, output) -> None:
    _mark(_first_tensor(output))


# Marks for the per-op trace only: a captured replay, which runs no layer's
# call, needs none (trace.python_state does not count them as user hooks).
_layer_starts._lazy_mlir_internal = _layer_ends._lazy_mlir_internal = True
