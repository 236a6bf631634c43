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

A shape-generic graph (``shape_generic``) gets fake inputs with symbolic
sizes and, for the size constants that vary with them (view and expand
sizes...), expressions of those sizes: each becomes ``sym_size`` and
``operator`` calls, as in Dynamo's graphs.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from .errors import ConversionError, NoSymbolicShapes
from .fused_optimizer import EXPANSIONS as _OPTIMIZER_EXPANSIONS
from .grad_scaler import EXPANSIONS as _GRAD_SCALER_EXPANSIONS
from .op_aliases import alias_of
from .size_constants import is_size_constant, size_constants  # noqa: F401 - re-exported

_EXPANSIONS = {**_OPTIMIZER_EXPANSIONS, **_GRAD_SCALER_EXPANSIONS}




def _describe(node: torch._C.Node) -> str:
    where = f" at {node.s('source')}" if node.hasAttribute("source") else ""
    return f"{node.kind()}{where}"


def _resolve_overload(node: torch._C.Node) -> torch._ops.OpOverload:
    schema = torch._C.parse_schema(node.schema())
    namespace, name = schema.name.split("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    # aten::random.from: generated code cannot name it, its stand-in it can
    return alias_of(getattr(packet, schema.overload_name or "default"))


def _view_of_copy(op: torch._ops.OpOverload):
    """``aten.expand.default`` for ``aten.expand_copy.default`` (None if not a view's copy)."""
    namespace, name = op._schema.name.split("::")
    if namespace != "aten" or not name.endswith("_copy"):
        return None
    view = getattr(getattr(torch.ops.aten, name[:-len("_copy")], None), op._overloadname, None)
    return view if isinstance(view, torch._ops.OpOverload) and view._schema.arguments[0].alias_info else None


_IMPLICIT = {"aten::ScalarImplicit", "aten::IntImplicit", "aten::FloatImplicit", "aten::BoolImplicit"}


def _fake_scalar(value: torch.Tensor):
    # The value is only a placeholder for its type: consumers' shapes don't depend on it.
    if value.dtype.is_floating_point:
        return 1.0
    if value.dtype == torch.bool:
        return True
    return 1


def fake_values(gm: fx.GraphModule, fake_mode: FakeTensorMode, fakes: list) -> None:
    """Gives every node of a graph this module made, or of a part of one,
    its ``meta["val"]`` as the conversion does (``fakes``: the inputs'; a
    scalar read from a tensor is a placeholder of its type): the minifier's
    parts get new inputs, which have none."""

    class Values(fx.Interpreter):
        def run_node(self, node):
            if node.op == "call_function" and node.target is torch.ops.aten.ScalarImplicit.default:
                result = _fake_scalar(self.env[node.args[0]])
            else:
                result = super().run_node(node)
            node.meta["val"] = result
            return result

    with fake_mode:
        Values(gm).run(*fakes)


class _Converter:
    def __init__(self, graph: torch._C.Graph, fake_mode: FakeTensorMode, input_fakes=None, size_exprs=None,
                 scalar_exprs=None):
        self.ts_graph = graph
        self.fake_mode = fake_mode
        self.input_fakes = input_fakes
        self.size_exprs = size_exprs or {}
        self.scalar_exprs = scalar_exprs or {}
        self.num_size_constants = 0
        self.sym_sizes: dict[tuple[int, int], fx.Node] = {}
        self.symbolic_scalars: dict[fx.Node, fx.Node] = {}  # 0-d size tensor -> its SymInt node
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
            placeholder.meta["val"] = (self.input_fakes[i] if self.input_fakes is not None
                                       else self.fake_mode.from_tensor(example, static_shapes=True))
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
        elif kind == "prim::ListUnpack":  # of a list-returning op expanded below (fused Adam)
            for value, item in zip(node.outputs(), self.env[node.input()]):
                self.env[value] = item
        elif kind in _IMPLICIT and self.env[node.input()] in self.symbolic_scalars:
            self.env[node.output()] = self.symbolic_scalars[self.env[node.input()]]
        elif kind in _IMPLICIT and self.env[node.input()] in self.constant_tensors:
            self.env[node.output()] = self.constant_tensors[self.env[node.input()]].item()
        elif kind.startswith(("aten::", "lazy_mlir::")):
            self._convert_call(node)
        else:
            raise ConversionError(f"lazy_mlir: cannot convert {_describe(node)} to FX")

    def _constant(self, node: torch._C.Node):
        value = node.output().toIValue()
        if is_size_constant(value):
            ordinal, self.num_size_constants = self.num_size_constants, self.num_size_constants + 1
            if ordinal in self.size_exprs:
                generic = self.size_exprs[ordinal]
                if isinstance(generic, list):
                    return [e if isinstance(e, int) else e.to_fx(self) for e in generic]
                if isinstance(value, torch.Tensor):
                    return self._symbolic_scalar_tensor(generic.to_fx(self), value)
                return generic.to_fx(self)
        if isinstance(value, torch.Tensor):
            name = f"_tensor_constant{self.num_constants}"
            self.num_constants += 1
            self.root.register_buffer(name, value)
            attr = self.graph.get_attr(name)
            attr.meta["val"] = self.fake_mode.from_tensor(value, static_shapes=True)
            self.constant_tensors[attr] = value
            return attr
        return value

    # ------------------------------------------------- size expressions' FX
    def sym_size(self, input_index: int, dim: int) -> fx.Node:
        key = (input_index, dim)
        if key not in self.sym_sizes:
            placeholder = list(self.input_index)[input_index]  # placeholders, in input order
            node = self.graph.call_function(torch.ops.aten.sym_size.int, (placeholder, dim))
            node.meta["val"] = placeholder.meta["val"].shape[dim]
            self.sym_sizes[key] = node
        return self.sym_sizes[key]

    def _symbolic_scalar_tensor(self, size: fx.Node, like: torch.Tensor) -> fx.Node:
        kwargs = {"dtype": like.dtype, "device": like.device}
        node = self.graph.call_function(torch.ops.aten.scalar_tensor.default, (size,), kwargs)
        with self.fake_mode:
            node.meta["val"] = torch.ops.aten.scalar_tensor.default(size.meta["val"], **kwargs)
        self.symbolic_scalars[node] = size  # what IntImplicit of it gives
        return node

    def _numel_of(self, value: torch._C.Value) -> fx.Node:
        node = self.graph.call_function(torch.ops.aten.sym_numel.default, (self.env[value],))
        node.meta["val"] = self._fake(self.env[value]).numel()
        return node

    def int_call(self, target, *args) -> fx.Node:
        node = self.graph.call_function(target, args)
        node.meta["val"] = target(*(self._fake(a) for a in args))
        return node

    def _specialize(self, value):
        """The concrete value of a ScalarImplicit of a group input, guarded."""
        if not isinstance(value, fx.Node) or value.target is not torch.ops.aten.ScalarImplicit.default:
            return value
        source = value.args[0]
        if source not in self.input_index:
            raise ConversionError(f"lazy_mlir: a shape depends on a computed scalar ({source})")
        index = self.input_index[source]
        if index in self.scalar_exprs:  # shape-generic: a size passed as a scalar (arange's end)
            return self.scalar_exprs[index].to_fx(self)
        concrete = self.example_inputs[index].item()
        self.guards.append((index, concrete))
        return concrete

    def _convert_arange_out(self, node: torch._C.Node) -> None:
        # LTC lowers arange to its out= form on an empty placeholder: use the functional one.
        start_v, end_v, step_v, out_v = node.inputs()
        fake_out = self._fake(self.env[out_v])
        start, step = self._specialize(self.env[start_v]), self._specialize(self.env[step_v])
        if isinstance(fake_out.numel(), torch.SymInt) and isinstance(start, int) and isinstance(step, int):
            # Shape-generic: LTC sized ``out`` for the range, so its length
            # gives the end (the same values), not a baked, guarded scalar.
            end = self.int_call(operator.add, start, self.int_call(operator.mul, self._numel_of(out_v), step))
        else:
            end = self._specialize(self.env[end_v])
        kwargs = {"dtype": fake_out.dtype, "device": fake_out.device}
        call = self.graph.call_function(torch.ops.aten.arange.start_step, (start, end, step), kwargs)
        with self.fake_mode:
            call.meta["val"] = torch.ops.aten.arange.start_step(start, self._fake(end), step, **kwargs)
        self.env[node.output()] = call

    def emit(self, target, *args, **kwargs) -> fx.Node:
        """One call of ``target`` with its fake value (for expansions of an op)."""
        call = self.graph.call_function(target, args, kwargs)
        with self.fake_mode:
            call.meta["val"] = target(*self._fake_args(args), **self._fake_args(kwargs))
        return call

    def _explicit_leading_indices(self, target: fx.Node, indices):
        """torch-mlir imports index_put with Tensor[] indices only (its
        ``hacked_twin``), and bicubic interpolation's backward writes with
        [None, None, rows, columns]. Each leading None (every element of
        that dim) becomes an arange shaped to broadcast before the other
        indices: the same elements, in the same order. Other patterns (a
        None after a tensor, boolean masks, symbolic sizes) are left as
        they are, for the importer to refuse (the group then runs in
        TorchScript)."""
        if not isinstance(indices, (list, tuple)) or None not in indices:
            return indices
        lead = next(i for i, index in enumerate(list(indices) + [0]) if index is not None)
        rest = list(indices[lead:])
        fakes = [self._fake(index) if index is not None else None for index in rest]
        sizes = self._fake(target).shape[:lead]
        if (not rest or any(f is None or f.dtype not in (torch.int64, torch.int32) for f in fakes)
                or not all(isinstance(n, int) for n in sizes)):
            return indices
        ndim = max(f.dim() for f in fakes)
        explicit = []
        for k, n in enumerate(sizes):
            every = self.emit(torch.ops.aten.arange.start_step, 0, n, 1, dtype=torch.int64, device=fakes[0].device)
            explicit.append(self.emit(torch.ops.aten.view.default, every, [n] + [1] * (lead - 1 - k + ndim)))
        return explicit + rest

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
        if op is torch.ops.aten._index_put_impl.default:
            # An indexing's backward (``table[idx]``: Swin's relative position
            # bias). Inductor lowers index_put, but not this op, which it left
            # to aten (the C++ wrapper through its proxy executor, warning of
            # a missing c-shim); ``unsafe`` only skips aten's index checks.
            op, args = torch.ops.aten.index_put.default, args[:4]
        if op in _INDEX_PUTS:
            args[1] = self._explicit_leading_indices(args[0], args[1])
        expand = _EXPANSIONS.get(op._schema.name)
        if expand is not None:  # expanded into per-tensor aten ops (tensor lists in and out, GradScaler's)
            try:
                results = expand(self.emit, self.graph, args + list(kwargs.values()))
            except Exception as exc:
                raise ConversionError(f"lazy_mlir: cannot expand {_describe(node)}: {exc}") from exc
            for value, result in zip(node.outputs(), results):
                self.env[value] = result
            return
        call = self.graph.call_function(op, tuple(args), kwargs)
        outputs = list(node.outputs())
        if op is torch.ops.aten.ScalarImplicit.default:
            call.meta["val"] = _fake_scalar(self._fake(args[0]))
        else:
            # The *_copy kernels take no symbolic sizes: a shape-generic graph
            # infers them from the view op (the copy is that view, contiguous).
            view = _view_of_copy(op) if self.input_fakes is not None else None
            with self.fake_mode:
                try:
                    if view is None:
                        call.meta["val"] = op(*self._fake_args(args), **self._fake_args(kwargs))
                    else:
                        call.meta["val"] = torch.utils._pytree.tree_map_only(
                            torch.Tensor, lambda t: t.clone(memory_format=torch.contiguous_format),
                            view(*self._fake_args(args), **self._fake_args(kwargs)))
                except Exception as exc:
                    if self.input_fakes is not None and isinstance(exc, UnsupportedOperatorException):
                        raise NoSymbolicShapes(f"{_describe(node)} has no shape function for symbolic sizes") from exc
                    raise ConversionError(f"lazy_mlir: shape inference failed for {_describe(node)}: {exc}") from exc
        if len(outputs) == 1:
            self.env[outputs[0]] = call
            return
        for i, value in enumerate(outputs):
            item = self.graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = call.meta["val"][i]
            self.env[value] = item


_INDEX_PUTS = (torch.ops.aten.index_put.default, torch.ops.aten._unsafe_index_put.default)


def ts_graph_to_fx(graph: torch._C.Graph, example_inputs, fake_mode: FakeTensorMode | None = None,
                   input_fakes=None, size_exprs=None, scalar_exprs=None):
    """Returns (GraphModule, fake_mode, guards). ``example_inputs`` fix shapes
    and dtypes; ``guards`` lists (input index, value) of scalar inputs whose
    value was baked in. ``input_fakes`` (made by ``fake_mode``) replace the
    static fakes of the inputs; ``size_exprs`` maps a size constant's ordinal
    (``size_constants``) to its value with expressions (``to_fx(converter)``)
    in place of the sizes that vary; ``scalar_exprs`` maps a 0-d input to the
    expression its value follows, used where its value would be baked in."""
    # A ShapeEnv (with only static shapes in it) lets Inductor use its FX
    # graph cache: without one it bypasses the cache ("No shape env").
    fake_mode = fake_mode or FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    converter = _Converter(graph, fake_mode, input_fakes, size_exprs, scalar_exprs)
    gm = converter.convert(example_inputs)
    return gm, fake_mode, converter.guards
