"""Corrections to Inductor's code generation that our graphs need, each
installed only while the Inductor in use has the defect (checked on its
source, so a torch that fixes it runs its own code).

- **Atomic adds in 2-D tiled CPU kernels** (torch <= 2.13 at least; upstream
  pytorch#191837): a CPU kernel that reads one input transposed is tiled in
  two dimensions (``CppTile2DKernel``). Its ``store`` offsets the index by
  the inner tile variable and hands it to ``CppVecKernel.store``, whose
  parallel ``atomic_add`` path (scatters: ``index_put(accumulate=True)``,
  the backward of advanced indexing, ``index_add``) derives the address
  again through ``ops.index_expr``, which in a tile offsets it once more.
  The scatter then writes at twice the tile offset: wrong values, and
  writes past the buffer (heap corruption). With one thread the store
  takes the non-atomic path and is right. A multi-query attention's
  backward (``qkv[..., [-2], :]``'s gradient fed by a transposed value)
  trained with wrong gradients through it. The fix hands the parallel
  atomic path the index untransformed: it is transformed exactly once.
- **A product plus a scaled tensor** (torch 2.13 at least; torch.compile
  computes it wrongly too): Inductor's post-grad pattern that fuses
  ``add(mm(a, b), c)`` into ``addmm(c, a, b)`` matches an ``add`` with an
  ``alpha`` and drops it, so ``mm(a, b) + 0.001 * c`` becomes ``mm(a, b) +
  c``. SGD's weight decay is that sum when a captured backward hands the
  optimizer a weight gradient straight from its product (``grad.add(p,
  alpha=weight_decay)``): a captured CNN trained with SGD and weight decay
  was 0.25 off eager in one step. ``rewrite`` spells such an ``add`` as
  ``add(x, mul(y, alpha))``, what Inductor's own lowering computes for it.
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.fx as fx


@functools.cache
def install() -> list[str]:
    """Installs the corrections this Inductor needs; returns their names."""
    installed = []
    if _tile2d_atomic_add_offset_twice():
        _fix_tile2d_atomic_add()
        installed.append("tile2d-atomic-add")
    return installed


def rewrite(gm: fx.GraphModule) -> int:
    """The graph rewrites this Inductor needs before it sees ``gm``; returns
    how many nodes were rewritten."""
    return _scale_added_products(gm) if _addmm_pattern_drops_alpha() else 0


@functools.cache
def _addmm_pattern_drops_alpha() -> bool:
    """Whether Inductor's add+mm -> addmm pattern ignores the add's alpha."""
    try:
        from torch._inductor.fx_passes import post_grad
        source = inspect.getsource(post_grad.addmm) + inspect.getsource(post_grad.is_valid_addmm_fusion)
    except (AttributeError, ImportError, OSError, TypeError):  # another Inductor: nothing of ours applies
        return False
    return "aten.addmm(inp, mat1, mat2)" in source and "alpha" not in source


def _scale_added_products(gm: fx.GraphModule) -> int:
    """``add(x, y, alpha=a)`` as ``add(x, mul(y, a))`` where ``a`` is not 1."""
    aten = torch.ops.aten
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) == 1 or len(node.args) != 2:
            continue
        x, y = node.args
        if not isinstance(y, fx.Node):
            continue
        with gm.graph.inserting_before(node):
            scaled = gm.graph.call_function(aten.mul.Tensor, (y, node.kwargs["alpha"]))
        if "val" in y.meta:
            scaled.meta["val"] = y.meta["val"]  # its sizes and dtype
        node.args, node.kwargs = (x, scaled), {}
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _tile2d_atomic_add_offset_twice() -> bool:
    """Whether Inductor's 2-D tile store transforms the index and its vector
    store's atomic path transforms it again (the defect's two halves)."""
    from torch._inductor.codegen import cpp

    try:
        tile_store = inspect.getsource(cpp.CppTile2DKernel.store)
        vec_store = inspect.getsource(cpp.CppVecKernel.store)
        tile_index_expr = inspect.getsource(cpp.CppTile2DOverrides.index_expr)
    except (AttributeError, OSError, TypeError):  # another Inductor: nothing of ours applies
        return False
    return ("new_index = self.transform_indexing(index)" in tile_store
            and "super().store(name, new_index, value, mode)" in tile_store
            and "ops.index_expr(index, torch.int64)" in vec_store
            and "transform_indexing" in tile_index_expr)


def _fix_tile2d_atomic_add() -> None:
    from torch._inductor import config
    from torch._inductor.codegen import cpp

    tile_store = cpp.CppTile2DKernel.store

    def store(self, name, index, value, mode=None):
        parallel_atomic = mode == "atomic_add" and (config.cpp.dynamic_threads or self.num_threads != 1)
        if parallel_atomic and not self.need_vec_transpose(self.rename_indexing(index)):
            # The vector store's atomic path offsets the index itself (the
            # tile's index_expr): pass it as the loop body gave it.
            return cpp.CppVecKernel.store(self, name, index, value, mode)
        return tile_store(self, name, index, value, mode)

    store.__wrapped__ = tile_store
    cpp.CppTile2DKernel.store = store
