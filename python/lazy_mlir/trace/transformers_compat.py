"""Hugging Face transformers treats lazy tensors as traced values.

transformers guards its data-dependent Python decisions (can this attention
mask be dropped? is there padding?) with ``is_tracing(tensor)``, true for
Dynamo, FX proxies, fake tensors and jax-jitted tensors. A lazy tensor is a
traced value too: reading it executes the step traced so far, one extra
graph execution per read. Unrecognised, BERT and T5 read their padding masks
every step (``masking_utils.fast_all``) and BART's decoder reads the mask of
ones it makes itself, so a user could not keep the step in one graph.

``install()`` makes ``is_tracing`` true for tensors on the lazy device, so
transformers takes the path it takes under torch.compile: the masks stay
tensors in the graph (same values; a mask it would have dropped is applied
in full). It wraps ``transformers.utils.import_utils.is_fake_tensor``, which
``is_tracing`` calls for its tensor argument and nothing else calls, so
every module that imported ``is_tracing`` by name sees it. transformers is
patched when it is imported (a ``sys.meta_path`` hook), or at once if it is
already. A transformers without that function is left as it is.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch

MODULE = "transformers.utils.import_utils"
_MARK = "_lazy_mlir_traces_lazy_tensors"


def install() -> None:
    when_imported(MODULE, _patch)


def when_imported(name: str, patch) -> None:
    """Calls ``patch(module)`` for the transformers module ``name``: now if
    it is imported, else right after its import (a ``sys.meta_path`` hook)."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _PatchOnImport)), None)
    if finder is None:
        finder = _PatchOnImport()
        sys.meta_path.insert(0, finder)
    if patch not in finder.patches.setdefault(name, []):
        finder.patches[name].append(patch)


def is_lazy(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "lazy"


def _patch(module) -> None:
    original = getattr(module, "is_fake_tensor", None)
    if original is None or getattr(original, _MARK, False):
        return

    def is_fake_tensor(x) -> bool:
        return is_lazy(x) or original(x)

    setattr(is_fake_tensor, _MARK, True)
    is_fake_tensor.__wrapped__ = original
    module.is_fake_tensor = is_fake_tensor


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each module of ``patches`` right after it is first imported."""

    def __init__(self):
        self.patches: dict[str, list] = {}  # module name -> its patch functions

    def find_spec(self, name, path=None, target=None):
        patches = self.patches.pop(name, None)
        if patches is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the real spec (this finder no longer answers for name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            for patch in patches:
                patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def register_cache_types(module) -> None:
    """Makes transformers' cache classes (``DynamicCache`` in a training
    forward's output) pytree nodes, so a captured forward (lazy_mlir.capture)
    can return them; transformers registers them itself for torch.export.
    Nothing for a module that is not a transformers model."""
    if not type(module).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters import exporter_dynamo
    except ImportError:  # an older transformers: a cache in the output fails the capture, with a warning
        return
    exporter_dynamo.register_cache_pytrees_for_model(module)
    # Its unflatten imports each class by its dotted path at every call:
    # 0.2 ms of a captured GPT-2 forward's 1 ms. A path names one class for
    # the life of the process, so the lookup is remembered.
    path_to_class = getattr(exporter_dynamo, "_path_to_class", None)
    if path_to_class is not None and not hasattr(path_to_class, "cache_info"):
        exporter_dynamo._path_to_class = functools.cache(path_to_class)
