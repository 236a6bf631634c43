"""An exported FX graph as bytes, and back, node for node.

Pickling a GraphModule stores its Python code, and unpickling traces that
code again: an op whose arguments are all literals (``aten.arange(0, 8)``)
then runs and comes back as a tensor constant, which Inductor's
``standalone_compile`` turns into an extra input its own wrapper does not
pass ("expected 17, got 16"). This form stores the nodes themselves (op,
name, target (an op by its name), arguments) and the tensor constants they read, so the graph
another process (or a later one, from the compile cache) compiles is the
graph exported here. Node metadata (fake values) is not kept: the compiler
is given fake inputs of the same layouts.
"""
from __future__ import annotations

import dataclasses
import pickle

import torch
import torch.fx as fx


@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str  # an earlier node's


@dataclasses.dataclass(frozen=True)
class _Op:
    qualified: str  # "aten::add"
    overload: str   # "Tensor" ("default" for none): OpOverloads pickle by name

    def resolve(self):
        namespace, name = self.qualified.split("::")
        return getattr(getattr(getattr(torch.ops, namespace), name), self.overload)


def _target(target):
    if isinstance(target, torch._ops.OpOverload):
        return _Op(target._schema.name, target._overloadname or "default")
    return target


def dumps(gm: fx.GraphModule) -> bytes:
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            constants[node.target] = getattr(gm, node.target).detach()
        args = fx.node.map_arg(node.args, lambda n: _Ref(n.name))
        kwargs = fx.node.map_arg(node.kwargs, lambda n: _Ref(n.name))
        nodes.append((node.op, node.name, _target(node.target), args, kwargs))
    return pickle.dumps({"nodes": nodes, "constants": constants})


def loads(data: bytes) -> fx.GraphModule:
    stored = pickle.loads(data)
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}

    def resolve(value):
        if isinstance(value, _Ref):
            return made[value.name]
        if isinstance(value, tuple):
            return tuple(resolve(v) for v in value)
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    for op, name, target, args, kwargs in stored["nodes"]:
        target = target.resolve() if isinstance(target, _Op) else target
        made[name] = graph.create_node(op, target, resolve(args), resolve(kwargs), name)
    root = torch.nn.Module()
    for name, tensor in stored["constants"].items():
        root.register_buffer(name, tensor)
    return fx.GraphModule(root, graph)
