"""codegen/memory_order.py: the order among Inductor's candidates that frees
a buffer as soon as its last reader can run."""
from lazy_mlir.codegen.memory_order import freeing_first


class SimpleNamespace:
    """Attributes given, hashed by identity (as Inductor's nodes and buffers are)."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def _graph(spec, outputs=()):
    """Scheduler nodes in the given order from ``spec``: name -> (bytes its
    output allocates, names of the nodes whose outputs it reads)."""
    nodes, bufs = {}, {}
    for index, (name, (size, reads)) in enumerate(spec.items()):
        buf = SimpleNamespace(name=name, mpi_buffer=SimpleNamespace(succ_nodes=[], size_free=size))
        buf.get_name = lambda name=name: name
        node = SimpleNamespace(name=name, mpi_node=SimpleNamespace(pred_nodes=[], succ_nodes=[], pred_buffers=[],
                                                                     size=size, index=index))
        node.get_outputs = lambda buf=buf: [buf]
        for read in reads:
            node.mpi_node.pred_nodes.append(nodes[read])
            node.mpi_node.pred_buffers.append(bufs[read])
            nodes[read].mpi_node.succ_nodes.append(node)
            bufs[read].mpi_buffer.succ_nodes.append(node)
        nodes[name], bufs[name] = node, buf
    return list(nodes.values())


def _names(order):
    return [node.name for node in order]


def test_an_update_runs_as_soon_as_its_gradient_is_final():
    # given order: a gradient, two more kernels, then the update that reads
    # the gradient last and writes its parameter in place (allocates nothing)
    nodes = _graph({"grad": (100, []), "x1": (100, []), "x2": (100, ["x1"]), "update": (0, ["grad"])})
    assert _names(freeing_first(nodes, graph_outputs=set())) == ["grad", "update", "x1", "x2"]


def test_otherwise_the_given_order_stays():
    # the recompute of a block (r1, r2) is ready from the start; it frees
    # nothing, so it stays where the backward (b) reads it
    nodes = _graph({"f": (50, []), "r1": (100, []), "r2": (100, ["r1"]), "b": (10, ["r2", "f"])})
    assert _names(freeing_first(nodes, graph_outputs=set())) == ["f", "r1", "r2", "b"]


def test_a_graph_output_is_not_freed():
    # "grad" is an output of the graph: reading it frees nothing, so the
    # reader waits for its turn
    nodes = _graph({"grad": (100, []), "x1": (100, []), "use": (0, ["grad"])})
    assert _names(freeing_first(nodes, graph_outputs={"grad"})) == ["grad", "x1", "use"]
