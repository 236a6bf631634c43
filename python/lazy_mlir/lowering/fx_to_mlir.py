"""FX -> torch dialect, through torch-mlir's FxImporter."""
from __future__ import annotations

import torch
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter


def import_graph(gm: torch.fx.GraphModule, func_name: str,
                 arg_attrs: dict[int, dict[str, str]] | None = None) -> ir.Module:
    """Imports an ATen FX graph as ``func.func @func_name`` in a new torch-dialect module.

    ``gm`` holds ``torch.ops.aten.*`` (and ``_c10d_functional.*``, imported as
    ``torch.operator``) calls with fake-tensor ``meta['val']`` on every node.
    The importer canonicalises a few nodes of ``gm.graph`` in place (e.g.
    ``lift_fresh_copy`` -> ``clone``); ``gm`` stays runnable.
    ``arg_attrs`` maps an argument index to ``{name: attribute text}``, e.g.
    ``{0: {"lazy_mlir.sharded": "true"}}``, set as the function's argument
    attributes. The returned module keeps its own ``Context`` alive.
    """
    context = ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    func = importer.import_stateless_graph(gm.graph, func_name=func_name)
    if arg_attrs:
        _set_arg_attrs(func, arg_attrs)
    return importer.module


def _set_arg_attrs(func, arg_attrs: dict[int, dict[str, str]]) -> None:
    num_args = len(func.type.inputs)
    bad = [i for i in arg_attrs if not 0 <= i < num_args]
    if bad:
        raise IndexError(f"arg_attrs for arguments {bad}, but @{func.name.value} has {num_args} arguments")
    with func.context:
        dicts = [ir.DictAttr.get({name: ir.Attribute.parse(text) for name, text in arg_attrs.get(i, {}).items()})
                 for i in range(num_args)]
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)
