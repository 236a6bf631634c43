"""MLIR's own code generation for one fusion group, run by the ExecutionEngine.

    torch dialect (after our passes) -(torch-mlir)-> linalg on tensors
      -(bufferize, loops)-> LLVM dialect -(ExecutionEngine)-> native code

The generated function writes its results into buffers the caller passes in
(``buffer-results-to-out-params``): the outputs are torch tensors allocated
here, so no memory crosses the boundary that torch does not own. A group
that torch-mlir cannot lower raises ``UnsupportedGroup`` naming the op, and
so does one on a GPU (the code runs on the host); the caller then uses
Inductor (``fallbacks`` counts the reasons).
"""
from __future__ import annotations

import collections
import ctypes
import functools
import logging
import re
import threading

import torch
from torch_mlir import ir, passmanager
from torch_mlir.dialects import func as func_d
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_MLIR_TYPE_ASM

# torch-mlir's function pipeline refines the types of the ops its
# decompositions create (the TorchDynamo one leaves some unranked).
TORCH_TO_LINALG = ("builtin.module(torch-function-to-torch-backend-pipeline,"
                   "torch-backend-to-linalg-on-tensors-backend-pipeline)")

LINALG_TO_LLVM = "builtin.module(" + ",".join([
    "func.func(linalg-generalize-named-ops)",
    "func.func(linalg-fuse-elementwise-ops)",
    "func.func(refback-generalize-tensor-pad)",
    "func.func(refback-generalize-tensor-concat)",
    "func.func(tm-tensor-bufferize)",
    # copy-before-write: the analysis rejects tm-tensor-bufferize's
    # to_tensor ops (sort, topk, cumsum, scatter); the copies cost nothing
    # measurable here. Identity layouts at the boundary: callers pass
    # contiguous tensors.
    "one-shot-bufferize{copy-before-write bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map}",
    # Results become caller-owned out-params; a result allocated in the
    # function is written there directly instead of copied.
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions}",
    "buffer-deallocation-pipeline",
    "func.func(tm-tensor-to-loops)",
    # memref.copy would otherwise call the C runner utils, not loaded here.
    "func.func(refback-munge-memref-copy)",
    "func.func(convert-linalg-to-loops)",
    "func.func(lower-affine)",
    "convert-scf-to-cf",
    "func.func(refback-expand-ops-for-llvm)",
    "func.func(arith-expand)",
    "func.func(convert-math-to-llvm)",
    "convert-math-to-libm",  # erf, tanh, ...: libm is in the process already
    "expand-strided-metadata",
    "lower-affine",
    "finalize-memref-to-llvm",
    "func.func(convert-arith-to-llvm)",
    "convert-func-to-llvm",
    "convert-cf-to-llvm",
    "reconcile-unrealized-casts",
]) + ")"

# Groups compiled here (name -> compiles) and groups sent to Inductor
# instead (reason -> count): read by tests and reports.
compiled_groups: collections.Counter = collections.Counter()
fallbacks: collections.Counter = collections.Counter()


class UnsupportedGroup(RuntimeError):
    """The group cannot be compiled by mlir-llvm; the message names the op and stage."""


_log = logging.getLogger(__name__)
_DTYPES = {asm: dtype for dtype, asm in TORCH_DTYPE_TO_MLIR_TYPE_ASM.items()}
_VTENSOR = re.compile(r"!torch\.vtensor<\[([0-9,]*)\],(\w+)>")
_BYTE_TENSOR = re.compile(r"!torch\.vtensor<\[[0-9,]*\],[su]i8>")
# The op a diagnostic is about, in its message or its "see current operation" note.
_OP_KIND = re.compile(r"operation '([\w.]+)'|= \"([\w.]+)\"\(")


def try_compile_module(module: ir.Module, fake_inputs: list, name: str, device: torch.device | str = "cpu"):
    """``compile_module``, or None when the group is unsupported (the reason
    counted in ``fallbacks``): the caller then uses Inductor."""
    try:
        return compile_module(module, fake_inputs, name, device)
    except UnsupportedGroup as exc:
        fallbacks[str(exc)] += 1
        _log.debug("mlir-llvm: group %s falls back to Inductor: %s", name, exc)
        return None


def compile_module(module: ir.Module, fake_inputs: list, name: str, device: torch.device | str = "cpu"):
    """Compiles the single function of a torch-dialect ``module`` (left
    unchanged), a group running on ``device``, to a callable
    list[Tensor] -> list[Tensor]. Raises ``UnsupportedGroup`` if any stage
    cannot handle the group."""
    # The code runs on the host and its outputs are CPU tensors: a GPU group's
    # device pointers must never reach it.
    off_host = sorted({str(d) for d in (torch.device(device), *(t.device for t in fake_inputs)) if d.type != "cpu"})
    if off_host:
        raise UnsupportedGroup(f"the group runs on {', '.join(off_host)}: mlir-llvm generates CPU code only")
    text = str(module)
    if _BYTE_TENSOR.search(text):
        # torch-mlir's convert-torch-to-linalg segfaults on (u)int8
        # elementwise ops with a scalar operand (convertScalarToDtype).
        raise UnsupportedGroup("8-bit integer tensors: torch-mlir's linalg lowering crashes on them")
    module = ir.Module.parse(text, module.context)
    func = _only_function(module)
    arg_types = [_tensor_type(t, f"argument {i}") for i, t in enumerate(func.type.inputs)]
    result_types = [_tensor_type(t, f"result {i}") for i, t in enumerate(func.type.results)]
    for i, (fake, (shape, dtype)) in enumerate(zip(fake_inputs, arg_types, strict=True)):
        if (tuple(fake.shape), fake.dtype) != (shape, dtype):
            raise UnsupportedGroup(f"argument {i} is {fake.dtype}{list(fake.shape)} but {dtype}{list(shape)} in MLIR")

    _run_pipeline(module, TORCH_TO_LINALG, "torch to linalg")
    _reject_random_numbers(module)
    func = _only_function(module)
    result_index = _return_each_value_once(func)
    func_name = func.sym_name.value  # func is gone once lowered to LLVM
    with module.context:
        func.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    _run_pipeline(module, LINALG_TO_LLVM, "linalg to llvm")
    try:
        engine = ExecutionEngine(module, opt_level=3, enable_object_dump=False)
        entry = engine.lookup(func_name)  # native code is generated here: symbols resolve here
    except RuntimeError as exc:
        raise UnsupportedGroup(f"ExecutionEngine: {exc}") from exc
    unique_types = [result_types[result_index.index(i)] for i in range(max(result_index, default=-1) + 1)]
    compiled_groups[name] += 1
    return _Kernel(engine, entry, arg_types, unique_types, result_index)


class _Kernel:
    """Calls the generated function on torch tensors through memref descriptors.

    The descriptors are built once (shapes are static) and only their data
    pointers change per call: rebuilding them cost ~60 us per call for 25
    tensors. The lock guards them, since ctypes releases the GIL in the call.
    """

    def __init__(self, engine: ExecutionEngine, entry, arg_types: list, unique_types: list, result_index: list[int]):
        self.engine = engine  # owns the code behind entry
        self.entry = entry
        self.unique_types = unique_types
        self.result_index = result_index
        self.descriptors = [_descriptor(shape) for shape, _ in (*arg_types, *unique_types)]
        # ciface convention: each argument is a pointer to a descriptor; the
        # packed entry point takes the address of each argument.
        self.pointers = [ctypes.pointer(d) for d in self.descriptors]
        self.packed = (ctypes.c_void_p * len(self.pointers))(*map(ctypes.addressof, self.pointers))
        self.lock = threading.Lock()

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # The function's arguments have identity layouts: LTC may hand over views.
        inputs = [t.contiguous() for t in inputs]
        outputs = [torch.empty(shape, dtype=dtype) for shape, dtype in self.unique_types]
        with self.lock:
            for descriptor, tensor in zip(self.descriptors, (*inputs, *outputs), strict=True):
                descriptor.allocated = descriptor.aligned = tensor.data_ptr()
            self.entry(self.packed)
        return [outputs[i] for i in self.result_index]


@functools.cache
def _descriptor_type(rank: int):
    class MemRefDescriptor(ctypes.Structure):
        # The layout finalize-memref-to-llvm gives a ranked memref.
        _fields_ = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64),
                    ("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return MemRefDescriptor


def _descriptor(shape: tuple[int, ...]):
    """A descriptor of a contiguous buffer of ``shape``, data pointer unset."""
    strides = torch.empty(shape, device="meta").stride()
    return _descriptor_type(len(shape))(None, None, 0, shape, strides)


def _only_function(module: ir.Module):
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise UnsupportedGroup(f"expected one func.func, found {len(funcs)}")
    return funcs[0]


def _tensor_type(mlir_type: ir.Type, what: str) -> tuple[tuple[int, ...], torch.dtype]:
    match = _VTENSOR.fullmatch(str(mlir_type))
    if not match or match[2] not in _DTYPES:
        raise UnsupportedGroup(f"{what} has type {mlir_type}, not a static !torch.vtensor of a known dtype")
    return tuple(int(d) for d in match[1].split(",") if d), _DTYPES[match[2]]


def _run_pipeline(module: ir.Module, pipeline: str, stage: str) -> None:
    with module.context:
        try:
            passmanager.PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as exc:
            raise UnsupportedGroup(f"{stage}: {_unlowered_torch_ops(module) or _first_error(exc)}") from None


def _unlowered_torch_ops(module: ir.Module) -> str:
    """'torch.aten.X x2, ...': the ops a failed lowering left behind (its
    diagnostic often names only a constant they use). Ops torch-mlir does
    not know (torch.operator) stop it before any other op is lowered: those
    alone are named then."""
    unknown, unlowered = collections.Counter(), collections.Counter()

    def visit(op):
        name = op.operation.name
        if name == "torch.operator":
            unknown[ir.StringAttr(op.attributes["name"]).value] += 1
        elif name.startswith(("torch.aten.", "torch.prims.")):
            unlowered[name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return ", ".join(name + (f" x{n}" if n > 1 else "") for name, n in (unknown or unlowered).most_common())


def _first_error(exc: ir.MLIRError) -> str:
    """'<op name>: <message>' of the first error diagnostic."""
    if not exc.error_diagnostics:
        return str(exc)
    diagnostic = exc.error_diagnostics[0]
    message = diagnostic.message.splitlines()[0][:200]
    for text in [diagnostic.message, *(note.message for note in diagnostic.notes)]:
        if match := _OP_KIND.search(text):
            return f"{match[1] or match[2]}: {message}"
    return message


def _reject_random_numbers(module: ir.Module) -> None:
    # torch-mlir draws random numbers from its own generator (a global seed
    # in ml_program), so the results could never match PyTorch's.
    found = []

    def visit(op):
        if op.operation.name.startswith("ml_program."):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if found:
        raise UnsupportedGroup("random numbers: torch-mlir's generator differs from PyTorch's")


def _return_each_value_once(func) -> list[int]:
    """Makes ``func`` return each value once (hoisting a result allocation
    into an out-param crashes on a value returned twice); returns, for each
    original result, the index of its value among the unique ones."""
    ret = func.regions[0].blocks[0].operations[-1]
    unique: list[ir.Value] = []
    result_index = []
    for value in ret.operands:
        if value not in unique:
            unique.append(value)
        result_index.append(unique.index(value))
    if len(unique) < len(result_index):
        with ir.InsertionPoint(ret), ret.location:
            func_d.ReturnOp(unique)
        ret.erase()
        with func.context:
            func.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(func.type.inputs, [v.type for v in unique]))
    return result_index
