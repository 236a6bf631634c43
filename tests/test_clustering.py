"""Structure of the clustering (C++ GraphClusterer driven by compilable.classify)."""
import pytest
import torch

import lazy_mlir
from lazy_mlir.cluster import compilable
from lazy_mlir.native import _C

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


def test_a_node_is_placed_in_the_group_of_its_reader(deny_tanh):
    g = torch._C.parse_ir("""
graph(%x : Tensor, %y : Tensor):
  %a : Tensor = aten::sin(%x)
  %b : Tensor = aten::cos(%y)
  %c : Tensor = aten::tanh(%a)
  %d : Tensor = aten::mul(%c, %b)
  return (%d)
""")
    assert _C.cluster(g) == 2
    # cos is placed with its reader, after tanh: {sin} before it, {cos, mul} after
    assert _glue_and_group_kinds(g) == (["aten::tanh"], [["aten::sin"], ["aten::cos", "aten::mul"]])
    g.lint()


def _glue_and_group_kinds(g):
    glue = [n.kind() for n in g.nodes() if n.kind() not in ("prim::FusionGroup", "prim::Constant")]
    groups = [sorted(n.kind() for n in group.g("Subgraph").nodes() if n.kind() != "prim::Constant")
              for group in g.nodes() if group.kind() == "prim::FusionGroup"]
    return glue, groups


def test_small_roots_of_inputs_and_outputs_stay_in_the_glue():
    """A loss summed across steps (``running = running + loss.detach()``,
    whose first step adds a Python float) is a small root of graph inputs and
    returned values: left in TorchScript, so the step's group is the same
    with it, without it and with its first form. The lowering marks small
    results (``small_result``, from LTC's shapes); the clusterer removes the
    mark. A small root that reads a group's inner value, and the large
    ones, stay in the group."""
    lazy_mlir.init("O1")
    g = torch._C.parse_ir("""
graph(%x : Tensor, %w : Tensor, %running : Tensor, %one : Tensor):
  %a : Scalar = aten::ScalarImplicit(%one)
  %h : Tensor = aten::mm(%x, %w)
  %none : NoneType = prim::Constant()
  %loss : Tensor = aten::sum[small_result=1](%h, %none)
  %inner : Tensor = aten::sum[small_result=1](%h, %none)
  %kept : Tensor = aten::detach_copy[small_result=1](%loss)
  %total : Tensor = aten::add[small_result=1](%running, %kept, %a)
  %twice : Tensor = aten::mul[small_result=1](%inner, %inner)
  %w2 : Tensor = aten::add(%w, %w, %a)
  return (%loss, %total, %twice, %w2)
""")
    assert _C.cluster(g) == 1
    glue, groups = _glue_and_group_kinds(g)
    assert glue == ["aten::ScalarImplicit", "aten::detach_copy", "aten::add"]
    assert groups == [["aten::ScalarImplicit", "aten::add", "aten::mm", "aten::mul", "aten::sum", "aten::sum"]]
    assert "small_result" not in str(g)
    g.lint()


def test_a_graph_of_small_roots_alone_is_still_compiled():
    """The running loss read after the last step, its add pending alone:
    a graph of small ops is also what an op's test compiles."""
    lazy_mlir.init("O1")
    g = torch._C.parse_ir("""
graph(%running : Tensor, %loss : Tensor, %one : Tensor):
  %a : Scalar = aten::ScalarImplicit(%one)
  %total : Tensor = aten::add[small_result=1](%running, %loss, %a)
  return (%total)
""")
    assert _C.cluster(g) == 1
    assert _glue_and_group_kinds(g)[0] == []


def test_a_small_result_unpacked_from_a_groups_list_stays_in_the_group():
    """An SGD step of one small parameter: the ListUnpack reads a Tensor[],
    which cannot leave a group."""
    lazy_mlir.init("O1")
    g = torch._C.parse_ir("""
graph(%p : Tensor, %g : Tensor, %lr : Tensor):
  %ps : Tensor[] = prim::ListConstruct(%p)
  %gs : Tensor[] = prim::ListConstruct(%g)
  %out : Tensor[] = lazy_mlir::sgd_step(%ps, %gs, %lr)
  %new : Tensor = prim::ListUnpack[small_result=1](%out)
  return (%new, %g)
""")
    assert _C.cluster(g) == 1
    assert _glue_and_group_kinds(g)[0] == []
    g.lint()


@pytest.mark.parametrize("whole_graph", [False, True], ids=["O1", "O2"])
def test_copies_of_graph_inputs_are_forwarded_to_their_readers(whole_graph):
    """A frozen weight at the first step is a detach copy of its data: its
    readers read the input itself, so the group is every later step's
    (``mm(x, w)``); a copy the graph returns stays in the glue, at O2 too."""
    lazy_mlir.init("O1")
    g = torch._C.parse_ir("""
graph(%x : Tensor, %w : Tensor, %b : Tensor, %one : Tensor):
  %a : Scalar = aten::ScalarImplicit(%one)
  %wd : Tensor = aten::detach_copy(%w)
  %ba : Tensor = aten::alias_copy(%b)
  %h : Tensor = aten::mm(%x, %wd)
  %y : Tensor = aten::add(%h, %ba, %a)
  return (%y, %ba)
""")
    assert _C.cluster(g, whole_graph=whole_graph) == 1
    glue, groups = _glue_and_group_kinds(g)
    assert glue == ["aten::alias_copy"] and groups == [["aten::ScalarImplicit", "aten::add", "aten::mm"]], str(g)
    assert "detach_copy" not in str(g)
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
