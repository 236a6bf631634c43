"""Structure of the clustering (C++ GraphClusterer driven by compilable.classify)."""
import pytest
import torch

import lazy_mlir
from lazy_mlir import _C, compilable

# LTC-style graph: 0-d scalar inputs through ScalarImplicit, constants, and a
# non-compilable op (tanh, denied below) in the middle of the data flow.
GRAPH = """
graph(%x : Tensor, %w : Tensor, %alpha : Tensor):
  %a : Scalar = aten::ScalarImplicit(%alpha)
  %y : Tensor = aten::mm[source="model.py forward 10"](%x, %w)
  %z : Tensor = aten::add[source="model.py forward 11"](%y, %x, %a)
  %t : Tensor = aten::tanh[source="model.py forward 12"](%z)
  %shape : int[] = prim::Constant[value=[16]]()
  %v : Tensor = aten::view_copy[source="model.py forward 13"](%t, %shape)
  %u : Tensor = aten::add[source="model.py forward 14"](%v, %v, %a)
  return (%u, %y)
"""


@pytest.fixture
def deny_tanh(monkeypatch):
    lazy_mlir.init("O1")
    monkeypatch.setattr(compilable, "DENIED", compilable.DENIED | {"aten::tanh"})


def _kinds(graph):
    return [n.kind() for n in graph.nodes()]


def test_non_compilable_op_splits_groups_and_plumbing_joins_them(deny_tanh):
    g = torch._C.parse_ir(GRAPH)
    assert _C.cluster(g) == 2
    kinds = _kinds(g)
    assert kinds.count("prim::FusionGroup") == 2 and "aten::tanh" in kinds
    # ScalarImplicit and constants were absorbed, once per group that uses them
    assert "aten::ScalarImplicit" not in kinds
    for group in (n for n in g.nodes() if n.kind() == "prim::FusionGroup"):
        inner = [n.kind() for n in group.g("Subgraph").nodes()]
        assert "aten::add" in inner
        assert all(i.type().kind() == "TensorType" for i in group.inputs())  # Tensor[] boundary
    g.lint()  # still a valid, topologically ordered graph


def test_everything_compilable_is_one_group():
    lazy_mlir.init("O1")
    g = torch._C.parse_ir(GRAPH)
    assert _C.cluster(g) == 1
    assert [k for k in _kinds(g) if k != "prim::Constant"] == ["prim::FusionGroup"]


def test_independent_chains_at_the_same_depth_share_a_group(deny_tanh):
    g = torch._C.parse_ir("""
graph(%x : Tensor, %y : Tensor):
  %a : Tensor = aten::sin(%x)
  %b : Tensor = aten::cos(%y)
  %c : Tensor = aten::tanh(%a)
  %d : Tensor = aten::mul(%c, %b)
  return (%d)
""")
    assert _C.cluster(g) == 2  # {sin, cos} before tanh, {mul} after
    g.lint()


def test_o2_names_the_op_and_its_source_line(deny_tanh):
    g = torch._C.parse_ir(GRAPH)
    with pytest.raises(RuntimeError, match=r"aten::tanh cannot be compiled \(at model.py forward 12\)"):
        _C.cluster(g, whole_graph=True)


def test_clustering_a_2000_node_graph_is_fast():
    lazy_mlir.init("O1")
    lines = ["graph(%x : Tensor, %s : Tensor):"]
    prev = "%x"
    for i in range(1000):
        lines.append(f"  %a{i} : Scalar = aten::ScalarImplicit(%s)")
        lines.append(f"  %v{i} : Tensor = aten::add({prev}, %x, %a{i})")
        prev = f"%v{i}"
    lines.append(f"  return ({prev})")
    g = torch._C.parse_ir("\n".join(lines))
    import time
    start = time.perf_counter()
    assert _C.cluster(g) == 1
    assert time.perf_counter() - start < 2.0
