"""torch dialect -> ATen FX graph with fake-tensor meta, for codegen after the MLIR passes.

The raw imported IR maps back to ATen 1:1 (docs/architecture.md, facts): ``torch.aten.X.ovl`` is a
call to ``torch.ops.aten.X.ovl`` with its operands in schema order. Constants,
lists and tuples become Python values inlined into the calls that use them;
dense literals become tensor attributes of the GraphModule.
"""
from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.fx.node import map_arg
from torch_mlir import ir
from torch_mlir.extras.fx_importer import (
    TORCH_DTYPE_TO_INT,
    TORCH_DTYPE_TO_MLIR_TYPE_ASM,
    TORCH_LAYOUT_TO_INT,
    TORCH_MEMORY_FORMAT_TO_INT,
)


class ExportError(RuntimeError):
    """An MLIR op that cannot become FX; the message names the op and its location."""


# The importer's own spelling of each dtype (signed ints are si64, ..., bool is i1).
_DTYPES = {asm: dtype for dtype, asm in TORCH_DTYPE_TO_MLIR_TYPE_ASM.items()}
# c10's ScalarType numbers, which TorchScript graphs (and so our MLIR) carry.
# torch-mlir's table (20261001) numbers the complex dtypes one too high
# (complex32 9, complex64 10: c10 has 8, 9 and 10 for complex128).
_SCALAR_TYPES = {**{i: dtype for dtype, i in TORCH_DTYPE_TO_INT.items() if not dtype.is_complex},
                 8: torch.complex32, 9: torch.complex64, 10: torch.complex128}
# The importer passes these enums as !torch.int; the schema's real type says which.
_ENUMS = {
    "ScalarType": _SCALAR_TYPES,
    "Layout": {i: layout for layout, i in TORCH_LAYOUT_TO_INT.items()},
    "MemoryFormat": {i: fmt for fmt, i in TORCH_MEMORY_FORMAT_TO_INT.items()},
}
_CONSTANTS = {
    "torch.constant.int": int,
    "torch.constant.float": float,
    "torch.constant.bool": bool,
    "torch.constant.str": str,
    "torch.constant.device": torch.device,
    "torch.constant.number": lambda value: value,
}
# Typed placeholders for scalars known only at run time (ScalarImplicit of an input).
_SCALAR_STAND_INS = {"!torch.float": 0.0, "!torch.int": 0, "!torch.bool": False}
# Size arithmetic of shape-generic groups: FX spells it as Dynamo does.
_SYMBOLIC_INT_OPS = {
    "torch.aten.size.int": torch.ops.aten.sym_size.int,
    "torch.aten.mul.int": operator.mul,
    "torch.aten.add.int": operator.add,
    "torch.aten.sub.int": operator.sub,
    "torch.aten.floordiv.int": operator.floordiv,
}
_VTENSOR = re.compile(r"!torch\.vtensor<\[([^\]]*)\],(complex<[^>]+>|[^,>]+)>")
_BLOB = re.compile(r'"0x([0-9A-Fa-f]*)"')


def export_graph(module: ir.Module, func_name: str, fake_mode: FakeTensorMode | None = None,
                 device: torch.device | str = "cpu",
                 arg_devices: Sequence[torch.device | str] | None = None,
                 arg_fakes: Sequence[torch.Tensor] | None = None) -> torch.fx.GraphModule:
    """Rebuilds ``func.func @func_name`` of a torch-dialect module as an ATen FX graph.

    Block arguments become placeholders ``arg0, arg1, ...`` whose ``meta['val']``
    is a fake contiguous tensor of the argument's type on its device in
    ``arg_devices`` (default: all on ``device``), made under ``fake_mode`` (a
    new ``FakeTensorMode(static_shapes=True)`` if None). MLIR types carry no
    device: literals and scalars made tensors are created on ``device``, the
    group's (the importer keeps a literal's values only). Every
    call node gets ``meta['val']`` by running its op on the fake inputs, checked
    against the MLIR result type, so Inductor can compile the graph with fake
    inputs. The graph always returns a tuple, one entry per ``func.return``
    operand. Raises ``ExportError`` for ops with no FX equivalent.

    A shape-generic group (``?`` dims) needs ``arg_fakes``: the fake inputs
    with symbolic sizes it was imported from (an MLIR type cannot say which
    ``?`` is which symbol). ``torch.aten.size.int`` and int arithmetic become
    ``sym_size`` and ``operator`` calls, as in Dynamo's graphs.
    """
    func = ir.SymbolTable(module.operation)[func_name]
    exporter = _Exporter(fake_mode or FakeTensorMode(static_shapes=True), torch.device(device))
    return exporter.run(func, arg_devices, arg_fakes)


class _Exporter:
    def __init__(self, fake_mode: FakeTensorMode, device: torch.device):
        self.fake_mode = fake_mode
        self.device = device
        self.graph = torch.fx.Graph()
        self.env: dict[ir.Value, Any] = {}  # MLIR value -> fx.Node or inlined Python value
        self.constants: dict[str, torch.Tensor] = {}

    def run(self, func, arg_devices, arg_fakes) -> torch.fx.GraphModule:
        block = func.regions[0].blocks[0]
        if arg_devices is None:
            arg_devices = [self.device] * len(block.arguments)
        if len(arg_devices) != len(block.arguments):
            raise ExportError(f"{len(arg_devices)} argument devices for {len(block.arguments)} arguments")
        if arg_fakes is not None and len(arg_fakes) != len(block.arguments):
            raise ExportError(f"{len(arg_fakes)} argument fakes for {len(block.arguments)} arguments")
        for i, (arg, device) in enumerate(zip(block.arguments, arg_devices)):
            node = self.graph.placeholder(f"arg{i}")
            if arg_fakes is not None:
                node.meta["val"] = arg_fakes[i]
                _check_types(arg, arg_fakes[i], f"argument {i}")
            else:
                shape, dtype = _tensor_type(str(arg.type), f"argument {i}")
                with self.fake_mode:
                    node.meta["val"] = torch.empty(shape, dtype=dtype, device=device)
            self.env[arg] = node
        for op in block.operations:
            op = op.operation
            try:
                values = self._export(op)
            except Exception as e:
                raise ExportError(f"cannot export {_describe(op)}: {e}") from e
            self.env.update(zip(op.results, values))
        return torch.fx.GraphModule(self.constants, self.graph)

    def _export(self, op: ir.Operation) -> list:
        """The FX node or Python value of each result of ``op``."""
        name = op.name
        if len(op.regions):
            raise ExportError("ops with regions are not supported")
        operands = [self.env[v] for v in op.operands]
        if name in _CONSTANTS:
            return [_CONSTANTS[name](op.attributes["value"].value)]
        if name == "torch.constant.none":
            return [None]
        if name == "torch.prim.ListConstruct":
            return [operands]
        if name == "torch.prim.TupleConstruct":
            return [tuple(operands)]
        if name in ("torch.prim.ListUnpack", "torch.prim.TupleUnpack"):
            return self._items(operands[0], op)
        if name == "torch.prim.TupleIndex":
            return [self._item(*operands)]
        if name == "torch.derefine":  # only refines the static type
            return operands
        if name == "torch.vtensor.literal":
            return [self._literal(op)]
        if name == "torch.prim.NumToTensor.Scalar":
            dtype = _tensor_type(str(op.results[0].type), "result")[1]
            return self._emit(op, torch.ops.aten.scalar_tensor.default, operands,
                              {"dtype": dtype, "device": self.device})
        if name == "func.return":
            self.graph.output(tuple(operands))
            return []
        if name in _SYMBOLIC_INT_OPS:  # sizes and their arithmetic: folded unless symbolic
            target = _SYMBOLIC_INT_OPS[name]
            value = target(*map_arg(tuple(operands), lambda n: n.meta["val"]))
            if isinstance(value, int):
                return [value]
            node = self.graph.call_function(target, tuple(operands))
            node.meta["val"] = value
            return [node]
        target = _aten_target(op.attributes["name"].value if name == "torch.operator" else name)
        if target is None:
            raise ExportError("unsupported op: no torch.ops overload of that name")
        return self._call(op, target, operands)

    def _call(self, op: ir.Operation, target, operands: list) -> list:
        plan = _arg_plan(target)
        if len(plan) != len(operands):
            raise ExportError(f"{len(operands)} operands but {target} takes {len(plan)} arguments")
        if target is torch.ops.aten.as_strided_copy.default and len(operands[1]) > 0:
            return [self._strided_gather(op, *operands)]
        args, kwargs = [], {}
        for (arg_name, kwarg_only, enum), value in zip(plan, operands):
            if enum is not None and isinstance(value, int):
                value = enum[value]
            if kwarg_only:
                kwargs[arg_name] = value
            else:
                args.append(value)
        return self._emit(op, target, args, kwargs)

    def _strided_gather(self, op: ir.Operation, x, size: list, stride: list, offset) -> torch.fx.Node:
        """``as_strided_copy(x, size, stride, offset)`` as a gather from x's
        values in row-major order, which is what it reads in eager (x is a
        fresh, contiguous tensor there). Inductor lowers as_strided onto the
        storage beneath x's views instead, in whatever layout it gave them:
        Longformer's overlapping chunks of a transposed reshape read other
        elements than eager's."""
        aten = torch.ops.aten

        def call(target, *args, **kwargs):
            node = self.graph.call_function(target, args, kwargs)
            fake_args, fake_kwargs = map_arg((args, kwargs), lambda n: n.meta["val"])
            with self.fake_mode:
                node.meta["val"] = target(*fake_args, **fake_kwargs)
            return node

        index = call(aten.scalar_tensor.default, offset or 0, dtype=torch.int64, device=self.device)
        for dim, (n, step) in enumerate(zip(size, stride)):
            positions = call(aten.mul.Tensor, call(aten.arange.default, n, dtype=torch.int64, device=self.device), step)
            shape = [1] * len(size)
            shape[dim] = -1
            index = call(aten.add.Tensor, index, call(aten.view.default, positions, shape))
        node = call(aten.index.Tensor, call(aten.reshape.default, x, [-1]), [index])
        _check_types(op.results[0], node.meta["val"], "result 0")
        return node

    def _emit(self, op: ir.Operation, target, args: list, kwargs: dict) -> list:
        node = self.graph.call_function(target, tuple(args), kwargs)
        node.meta["val"] = self._fake_result(op, node)
        if len(target._schema.returns) < 2:
            return [node] * len(op.results)
        return self._items(node, op)

    def _fake_result(self, op: ir.Operation, node: torch.fx.Node):
        fake_args, fake_kwargs = map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        if torch.Tag.pointwise in node.target.tags:
            fake_args = tuple(self._dense_stand_in(a) if _gapped_row_major(a) else a for a in fake_args)
        try:
            with self.fake_mode:
                val = node.target(*fake_args, **fake_kwargs)
        except DataDependentOutputException:  # a scalar read from a tensor, e.g. ScalarImplicit
            return _scalar_stand_in(str(op.results[0].type), fake_args)
        vals = val if len(op.results) > 1 else (val,)
        for i, (result, fake) in enumerate(zip(op.results, vals)):
            _check_types(result, fake, f"result {i}")
        return val

    def _dense_stand_in(self, fake: torch.Tensor) -> torch.Tensor:
        """A contiguous fake of ``fake``'s sizes. The metas of unary pointwise
        ops (``silu``: ``empty_like``) read a gapped tensor's strides as ints,
        which would pin every symbol in them to this size. Eager gives such an
        input's result contiguous, as this does."""
        with self.fake_mode:
            return torch.empty(fake.shape, dtype=fake.dtype, device=fake.device)

    def _items(self, container, op: ir.Operation) -> list:
        """The elements of ``container`` that ``op``'s used results stand for (a getitem each)."""
        return [self._item(container, i) if _has_uses(r) else None for i, r in enumerate(op.results)]

    def _item(self, container, index: int):
        if not isinstance(container, torch.fx.Node):
            return container[index]
        node = self.graph.call_function(operator.getitem, (container, index))
        node.meta["val"] = container.meta["val"][index]
        return node

    def _literal(self, op: ir.Operation) -> torch.fx.Node:
        shape, dtype = _tensor_type(str(op.results[0].type), "result")
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = tensor = _literal_tensor(op, shape, dtype).to(self.device)
        node = self.graph.get_attr(name)
        node.meta["val"] = self.fake_mode.from_tensor(tensor)
        return node


@cache
def _tensor_type(type_asm: str, what: str) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of a static ``!torch.vtensor<[2,3],f32>``."""
    match = _VTENSOR.fullmatch(type_asm)
    if not match or "?" in match[1] or match[2] not in _DTYPES:
        raise ExportError(f"{what} has type {type_asm}, not a static !torch.vtensor of a known dtype")
    shape = tuple(int(d) for d in match[1].split(",")) if match[1] else ()
    return shape, _DTYPES[match[2]]


@cache
def _aten_target(mlir_name: str):
    """``torch.<ns>.<op>[.<overload>]`` -> ``torch.ops.<ns>.<op>.<overload>`` (None if absent)."""
    parts = mlir_name.split(".")
    if parts[0] != "torch" or len(parts) not in (3, 4):
        return None
    namespace, op_name, overload = parts[1], parts[2], parts[3] if len(parts) == 4 else "default"
    try:
        target = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
    except (AttributeError, RuntimeError):
        return None
    return target if isinstance(target, torch._ops.OpOverload) else None


@cache
def _arg_plan(target) -> tuple[tuple[str, bool, dict | None], ...]:
    """(name, kwarg-only, enum table) for each schema argument of ``target``."""
    def enum_of(arg):
        return _ENUMS.get(str(arg.real_type).removeprefix("Optional[").removesuffix("]"))
    return tuple((arg.name, arg.kwarg_only, enum_of(arg)) for arg in target._schema.arguments)


def _has_uses(value: ir.Value) -> bool:
    return next(iter(value.uses), None) is not None


def _gapped_row_major(value) -> bool:
    """A symbolic tensor laid out row-major with gaps (a slice of its last
    dim: Phi-3's chunked gate/up projection), judged at the example sizes as
    Inductor judges layouts: no guard is added."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2 or all(isinstance(s, int) for s in value.shape):
        return False
    sizes, strides = [_hint(s) for s in value.shape], [_hint(s) for s in value.stride()]
    if None in sizes or None in strides or strides[-1] != 1:
        return False
    pairs = range(value.dim() - 1)
    return all(strides[i] >= strides[i + 1] for i in pairs) and \
        any(strides[i] != strides[i + 1] * sizes[i + 1] for i in pairs)


def _hint(size):
    """A size's example value (None for one without: data-dependent)."""
    return size.node.hint if isinstance(size, torch.SymInt) else size


def _scalar_stand_in(type_asm: str, fake_args):
    """A typed placeholder for a scalar result only known at run time."""
    if type_asm in _SCALAR_STAND_INS:
        return _SCALAR_STAND_INS[type_asm]
    tensors = [a for a in fake_args if isinstance(a, torch.Tensor)]
    if type_asm != "!torch.number" or not tensors:
        raise ExportError(f"its {type_asm} result depends on tensor data")
    return 0.0 if tensors[0].dtype.is_floating_point else 0  # ScalarImplicit: the tensor's dtype decides


def _check_types(value: ir.Value, fake, what: str) -> None:
    """A fake value must agree with its MLIR type (catches pass bugs early); a
    ``?`` dim must be symbolic."""
    type_asm = str(value.type)
    if not type_asm.startswith("!torch.vtensor<"):
        return
    match = _VTENSOR.fullmatch(type_asm)
    expected = None if match is None else (
        [None if d == "?" else int(d) for d in match[1].split(",")] if match[1] else [], _DTYPES.get(match[2]))
    if expected is None or not isinstance(fake, torch.Tensor) or fake.dtype != expected[1] or \
            len(fake.shape) != len(expected[0]) or \
            any((not isinstance(d, int)) != (e is None) or (e is not None and d != e)
                for d, e in zip(fake.shape, expected[0])):
        got = (tuple(fake.shape), fake.dtype) if isinstance(fake, torch.Tensor) else type(fake).__name__
        raise ExportError(f"{what} is {got} when run, but {type_asm} in MLIR")


def _literal_tensor(op: ir.Operation, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    attr = op.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        if attr.is_splat:
            return torch.full(shape, attr.get_splat_value().value, dtype=dtype)
        return torch.from_numpy(np.array(attr)).to(dtype).reshape(shape)
    ir.DenseResourceElementsAttr(attr)  # raises ValueError for any other attribute kind
    return torch.frombuffer(bytearray(_resource_blob(op)), dtype=dtype).reshape(shape)


def _resource_blob(op: ir.Operation) -> bytes:
    """The bytes behind a ``dense_resource``. The Python API cannot read a blob, but
    a detached op prints the blobs it uses (only top-level ops print resources)."""
    clone = op.clone(ip=False)
    try:
        match = _BLOB.search(clone.get_asm())
    finally:
        clone.erase()
    if match is None:
        raise ExportError("the dense_resource blob is missing (elided?)")
    return bytes.fromhex(match[1])[4:]  # the blob starts with its 4-byte alignment


def _describe(op: ir.Operation) -> str:
    text = op.get_asm(large_elements_limit=4, skip_regions=True, assume_verified=True).strip().splitlines()[0]
    if len(text) > 160:
        text = text[:157] + "..."
    return f"'{op.name}' at {op.location}: {text}"
