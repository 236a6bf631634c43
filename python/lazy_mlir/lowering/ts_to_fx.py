"""TorchScript fusion-group subgraph -> torch.fx GraphModule of aten overloads.

Each ``aten::`` (or our own ``lazy_mlir::``) node becomes a call of the resolved overload
(``node.schema()`` names it), with kwarg-only arguments split out by the
schema; constants and ``prim::ListConstruct`` are inlined as Python values;
tensor constants become module attributes. Every node gets ``meta['val']``
from a FakeTensorMode with static shapes, seeded from the group's real
inputs at first run (LTC keys graphs by shape, so they never change).
``aten::ScalarImplicit`` (LTC's 0-d tensor -> Scalar) of a runtime input is
kept as a node whose fake value is a Python number (an MLIR pass rewrites its
consumers); the ``*Implicit`` of a tensor constant is folded to its value.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from .op_aliases import alias_of


class ConversionError(RuntimeError):
    """A node the converter cannot express; names the op and its source line."""


def _describe(node: torch._C.Node) -> str:
    where = f" at {node.s('source')}" if node.hasAttribute("source") else ""
    return f"{node.kind()}{where}"


def _resolve_overload(node: torch._C.Node) -> torch._ops.OpOverload:
    schema = torch._C.parse_schema(node.schema())
    namespace, name = schema.name.split("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    # aten::random.from: generated code cannot name it, its stand-in it can
    return alias_of(getattr(packet, schema.overload_name or "default"))


_IMPLICIT = {"aten::ScalarImplicit", "aten::IntImplicit", "aten::FloatImplicit", "aten::BoolImplicit"}


def _fake_scalar(value: torch.Tensor):
    # The value is only a placeholder for its type: consumers' shapes don't depend on it.
    if value.dtype.is_floating_point:
        return 1.0
    if value.dtype == torch.bool:
        return True
    return 1


class _Converter:
    def __init__(self, graph: torch._C.Graph, fake_mode: FakeTensorMode):
        self.ts_graph = graph
        self.fake_mode = fake_mode
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[torch._C.Value, object] = {}  # TS value -> fx Node or Python value
        self.num_constants = 0
        self.constant_tensors: dict[fx.Node, torch.Tensor] = {}
        self.input_index: dict[fx.Node, int] = {}
        self.example_inputs = []
        # (input index, value): runtime scalars baked into the code because a
        # shape depends on them; the executable checks them at every call.
        self.guards: list[tuple[int, object]] = []

    def _fake(self, value):
        return value.meta["val"] if isinstance(value, fx.Node) else value

    def _fake_args(self, args):
        return torch.utils._pytree.tree_map(self._fake, args)

    def convert(self, example_inputs) -> fx.GraphModule:
        self.example_inputs = list(example_inputs)
        for i, (value, example) in enumerate(zip(self.ts_graph.inputs(), example_inputs)):
            placeholder = self.graph.placeholder(f"arg{i}")
            self.input_index[placeholder] = i
            placeholder.meta["val"] = self.fake_mode.from_tensor(example, static_shapes=True)
            self.env[value] = placeholder
        for node in self.ts_graph.nodes():
            self._convert_node(node)
        outputs = [self.env[v] for v in self.ts_graph.outputs()]
        self.graph.output(tuple(outputs))
        return fx.GraphModule(self.root, self.graph, class_name="FusionGroup")

    def _convert_node(self, node: torch._C.Node) -> None:
        kind = node.kind()
        if kind == "prim::Constant":
            self.env[node.output()] = self._constant(node)
        elif kind == "prim::ListConstruct":
            self.env[node.output()] = [self.env[v] for v in node.inputs()]
        elif kind in _IMPLICIT and self.env[node.input()] in self.constant_tensors:
            self.env[node.output()] = self.constant_tensors[self.env[node.input()]].item()
        elif kind.startswith(("aten::", "lazy_mlir::")):
            self._convert_call(node)
        else:
            raise ConversionError(f"lazy_mlir: cannot convert {_describe(node)} to FX")

    def _constant(self, node: torch._C.Node):
        value = node.output().toIValue()
        if isinstance(value, torch.Tensor):
            name = f"_tensor_constant{self.num_constants}"
            self.num_constants += 1
            self.root.register_buffer(name, value)
            attr = self.graph.get_attr(name)
            attr.meta["val"] = self.fake_mode.from_tensor(value, static_shapes=True)
            self.constant_tensors[attr] = value
            return attr
        return value

    def _specialize(self, value):
        """The concrete value of a ScalarImplicit of a group input, guarded."""
        if not isinstance(value, fx.Node) or value.target is not torch.ops.aten.ScalarImplicit.default:
            return value
        source = value.args[0]
        if source not in self.input_index:
            raise ConversionError(f"lazy_mlir: a shape depends on a computed scalar ({source})")
        index = self.input_index[source]
        concrete = self.example_inputs[index].item()
        self.guards.append((index, concrete))
        return concrete

    def _convert_arange_out(self, node: torch._C.Node) -> None:
        # LTC lowers arange to its out= form on an empty placeholder: use the functional one.
        start, end, step, out = (self._specialize(self.env[v]) for v in node.inputs())
        fake_out = self._fake(out)
        kwargs = {"dtype": fake_out.dtype, "device": fake_out.device}
        call = self.graph.call_function(torch.ops.aten.arange.start_step, (start, end, step), kwargs)
        with self.fake_mode:
            call.meta["val"] = torch.ops.aten.arange.start_step(start, end, step, **kwargs)
        self.env[node.output()] = call

    def _convert_call(self, node: torch._C.Node) -> None:
        op = _resolve_overload(node)
        if op is torch.ops.aten.arange.start_out:
            return self._convert_arange_out(node)
        args, kwargs = [], {}
        for formal, value in zip(op._schema.arguments, node.inputs()):
            converted = self.env[value]
            if formal.kwarg_only:
                kwargs[formal.name] = converted
            else:
                args.append(converted)
        call = self.graph.call_function(op, tuple(args), kwargs)
        outputs = list(node.outputs())
        if op is torch.ops.aten.ScalarImplicit.default:
            call.meta["val"] = _fake_scalar(self._fake(args[0]))
        else:
            with self.fake_mode:
                try:
                    call.meta["val"] = op(*self._fake_args(args), **self._fake_args(kwargs))
                except Exception as exc:
                    raise ConversionError(f"lazy_mlir: shape inference failed for {_describe(node)}: {exc}") from exc
        if len(outputs) == 1:
            self.env[outputs[0]] = call
            return
        for i, value in enumerate(outputs):
            item = self.graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = call.meta["val"][i]
            self.env[value] = item


def ts_graph_to_fx(graph: torch._C.Graph, example_inputs, fake_mode: FakeTensorMode | None = None):
    """Returns (GraphModule, fake_mode, guards). ``example_inputs`` fix shapes
    and dtypes; ``guards`` lists (input index, value) of scalar inputs whose
    value was baked in."""
    # A ShapeEnv (with only static shapes in it) lets Inductor use its FX
    # graph cache: without one it bypasses the cache ("No shape env").
    fake_mode = fake_mode or FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    converter = _Converter(graph, fake_mode)
    gm = converter.convert(example_inputs)
    return gm, fake_mode, converter.guards
