"""Cache keys of fusion groups: what a group computes, not where it came from.

``str(graph)`` names values by LTC's numbering and carries each node's
``source`` attribute (the user's line), so the same group traced from another
line or in another process would look new. The structural form keeps node
kinds, attributes other than ``source``, wiring by position (inputs, then node
outputs in order) and value types; tensor constants count by their bytes.
The full key adds the input signature, the configuration key (which covers
the pass pipeline and the passes' sources) and ``environment_id()``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os

import torch

from ..lowering.size_constants import is_size_constant

# Debug metadata that does not change what a node computes.
_IGNORED_ATTRIBUTES = frozenset({"source"})


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (any dtype, any layout)."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def _tensor_form(t: torch.Tensor) -> tuple:
    return ("tensor", str(t.dtype), tuple(t.shape), tuple(t.stride()), tensor_digest(t))


def _value_form(value) -> object:
    """A deterministic, hashable stand-in for an attribute or constant value."""
    if isinstance(value, torch.Tensor):
        return _tensor_form(value)
    if isinstance(value, float):
        return ("float", value.hex())  # exact; repr would also do, hex says so
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value_form(v) for v in value))
    if isinstance(value, torch._C.Graph):
        return ("graph", structure(value))
    if isinstance(value, (bool, int, str, type(None))):
        return value
    return (type(value).__name__, str(value))  # dtype, device, layout ...


def _block_form(inputs, nodes, outputs, numbering: dict, abstract_sizes: bool = False) -> list:
    for value in inputs:
        numbering[value] = len(numbering)
    form = [("in", tuple(str(v.type()) for v in inputs))]
    for node in nodes:
        if abstract_sizes and node.kind() == "prim::Constant" and is_size_constant(node.output().toIValue()):
            value = node.output().toIValue()
            attributes = (("sizes", len(value) if isinstance(value, list) else None),)
        else:
            attributes = tuple(
                (name, node.kindOf(name), _value_form(getattr(node, node.kindOf(name))(name)))
                for name in sorted(node.attributeNames()) if name not in _IGNORED_ATTRIBUTES)
        blocks = tuple(tuple(_block_form(list(b.inputs()), b.nodes(), list(b.outputs()), numbering, abstract_sizes))
                       for b in node.blocks())
        wiring = tuple(numbering[v] for v in node.inputs())
        results = list(node.outputs())
        for value in results:
            numbering[value] = len(numbering)
        form.append((node.kind(), attributes, wiring, tuple(str(v.type()) for v in results), blocks))
    form.append(("out", tuple(numbering[v] for v in outputs)))
    return form


def structure(graph: torch._C.Graph, abstract_sizes: bool = False) -> str:
    """Digest of the graph's canonical form (no source lines, no value names;
    with ``abstract_sizes``, no size constants: see shape_generic)."""
    form = _block_form(list(graph.inputs()), graph.nodes(), list(graph.outputs()), {}, abstract_sizes)
    return hashlib.sha256(repr(form).encode()).hexdigest()


def input_signature(inputs: list[torch.Tensor]) -> tuple:
    """Per input: sizes, strides, dtype, device, and which earlier input it is
    (LTC passes one tensor twice; the compiled code may rely on that)."""
    first: dict[int, int] = {}
    signature = []
    for i, t in enumerate(inputs):
        same_as = first.setdefault(id(t), i)
        signature.append((tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device),
                          same_as if same_as != i else None))
    return tuple(signature)


# lazy_mlir's own code that turns a group into an executable: editing it
# (an editable install keeps its version) must not serve stale entries;
# shape_generic writes the size expressions of generic groups.
# under the package: what decides the code a key names and how an entry reads
_LOWERING_CODE = ("lowering", "codegen", "cache/compile_cache.py", "cache/group_key.py", "compile/shape_generic.py")


@functools.cache
def environment_id() -> str:
    """torch, torch-mlir and lazy_mlir versions plus the lowering code's sources."""
    digest = hashlib.sha256()
    for dist in ("torch", "torch-mlir", "lazy_mlir"):
        try:
            digest.update(f"{dist}={importlib.metadata.version(dist)};".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{dist}=?;".encode())
    digest.update(torch.__version__.encode())
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the lazy_mlir package
    for entry in _LOWERING_CODE:
        path = os.path.join(here, entry)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".py"))
        for file in files:
            with open(file, "rb") as f:
                digest.update(os.path.relpath(file, here).encode() + b"\0" + f.read())
    return digest.hexdigest()


def group_key(graph: torch._C.Graph, inputs: list[torch.Tensor], config_key: str,
              graph_structure: str | None = None) -> str:
    """Hex digest naming one compiled variant of a group (guard values aside);
    ``graph_structure``: ``structure(graph)``, when the caller has it."""
    parts = (graph_structure or structure(graph), input_signature(inputs), config_key, environment_id())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def family(graph: torch._C.Graph) -> str:
    """What stays when only sizes, layouts or scalar values change: the
    sequence of op kinds and their user source lines (constants, which hold
    sizes, left out). Variants of one family are recompiles of one group."""
    form = [(n.kind(), n.s("source") if n.hasAttribute("source") else "")
            for n in graph.nodes() if n.kind() != "prim::Constant"]
    return hashlib.sha256(repr(form).encode()).hexdigest()
