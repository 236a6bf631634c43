"""One more order among those Inductor weighs for a group's peak memory.

Inductor orders a graph's kernels for memory (``reorder_for_peak_memory``):
it estimates the peak of the order it was given and of three greedy
topological orders (lpmf, bfs, dfs) and keeps the lowest. A training step
compiled as one graph defeats all four. The given order realizes every
optimizer update at the graph's end, so every gradient is alive at once;
lpmf interleaves the updates but, greedy over every ready kernel, runs the
recompute of checkpointed blocks early (GPT-2-small's shape with every
block checkpointed: 11 layers' attention probabilities alive at its peak,
321 MB by its estimate, the step's buffers 306 MiB measured).

``freeing_first`` is the given order, except that a ready kernel which
frees at least what it allocates (an update reading a gradient for the
last time and writing its parameter in place) runs at once: gradients go
as soon as they are final, and recompute stays where the backward reads it
(the same step: 145 MiB measured). It joins the
candidates while lazy_mlir compiles; the lowest estimate still wins
(without checkpointing there, lpmf's: 416 MB against 427).
"""
from __future__ import annotations

import contextlib
import functools
import threading


def freeing_first(nodes: list, graph_outputs) -> list:
    """``nodes`` (Inductor's scheduler nodes, their memory planning info
    assigned) in their order, a ready node that frees at least what it
    allocates first."""
    remaining_users: dict = {}

    def users(buf) -> int:
        if buf not in remaining_users:
            remaining_users[buf] = len(buf.mpi_buffer.succ_nodes) + (1 if buf.get_name() in graph_outputs else 0)
        return remaining_users[buf]

    def frees_what_it_takes(node) -> bool:
        """Whether running ``node`` frees an input it reads last, and at least the bytes it allocates."""
        inputs = sum(buf.mpi_buffer.size_free for buf in node.mpi_node.pred_buffers if users(buf) == 1)
        unused = sum(buf.mpi_buffer.size_free for buf in node.get_outputs() if users(buf) == 0)
        return inputs > 0 and inputs + unused >= node.mpi_node.size

    waiting = {node: len(node.mpi_node.pred_nodes) for node in nodes}
    ready = {node for node, n in waiting.items() if n == 0}
    order = []
    while ready:
        freeing = [node for node in ready if frees_what_it_takes(node)]
        node = min(freeing or ready, key=lambda n: n.mpi_node.index)
        ready.remove(node)
        order.append(node)
        for buf in node.mpi_node.pred_buffers:
            remaining_users[buf] = users(buf) - 1
        for succ in node.mpi_node.succ_nodes:
            waiting[succ] -= 1
            if waiting[succ] == 0:
                ready.add(succ)
    return order


_active = threading.local()  # on while this thread compiles a group


@functools.cache
def _install() -> None:
    import torch._inductor.memory as memory

    original = memory.reorder_for_peak_memory

    def reorder(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs, **kwargs):
        if not getattr(_active, "on", False):  # torch.compile's own compiles: Inductor's candidates
            return original(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs, **kwargs)

        def freeing_first_order(order):
            return freeing_first(order, graph_outputs)
        freeing_first_order.__name__ = "freeing_first"
        methods = kwargs.pop("methods", [memory.topological_sort_lpmf, memory.topological_sort_bfs,
                                         memory.topological_sort_dfs])
        return original(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs,
                        methods=[*methods, freeing_first_order], **kwargs)

    memory.reorder_for_peak_memory = reorder  # the scheduler imports it at each call


@contextlib.contextmanager
def candidate_orders():
    """While a group compiles on this thread: ``freeing_first`` among the
    orders Inductor weighs."""
    _install()
    _active.on = True
    try:
        yield
    finally:
        _active.on = False
