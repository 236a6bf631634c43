"""One fusion group from TorchScript to an executable, stage by stage:

    TS subgraph -(ts_to_fx)-> FX -(FxImporter)-> torch dialect
      -(mlir_passes pipeline)-> torch dialect -(export)-> FX -(codegen)-> callable

Every compiled group really goes through MLIR: the code generator's input is
exported from the module after the passes. Each stage is timed into the
metrics and, with ``Config.dump_dir``, dumped per group.

With the persistent cache on, the group also keeps what another process
needs to skip these stages (``LoweredGroup.artifacts``: the exported FX
graph (``portable_graph``) and Inductor's compiled artefact, which skips code
generation too); ``load_group`` rebuilds the executable from them.
"""
from __future__ import annotations

import dataclasses
import struct
import time
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import mlir_passes
from mlir_passes.specialize_scalars import SPECIALIZED_ATTR, VALUE_ATTR
from torch_mlir import ir

from .. import config
from ..codegen import conv_layout, copied_reshapes, donation, eager_rounding, inductor, onednn_linear
from ..observe import dump, metrics
from . import portable_graph, symbolic_metas
from .fx_to_mlir import import_graph
from .lowered_group import LoweredGroup
from .mlir_to_fx import export_graph
from .ts_to_fx import fake_values, ts_graph_to_fx


class _Stage:
    """Times one stage into the metrics."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        metrics.record_stage(self.name, time.perf_counter() - self.start)


def lower_group(graph: torch._C.Graph, example_inputs: list, name: str, cfg: config.Config,
                symbolic=None) -> LoweredGroup:
    """``symbolic`` (a ``shape_generic.Symbolic``: fake mode, fake inputs with
    symbolic sizes, size expressions) compiles the shape-generic form: then
    Inductor's code takes any size its shape guards admit."""
    prepared = prepare_group(graph, example_inputs, name, cfg, symbolic)
    if isinstance(prepared, LoweredGroup):  # mlir-llvm's code
        return prepared
    return generate_code(prepared, cfg)


@dataclasses.dataclass
class PreparedGroup:
    """A group lowered up to code generation: the FX graph exported after the
    MLIR passes, the fakes of its inputs, and what the code will assume.
    ``parallel_compile`` hands these to other processes (``artifacts["graph"]``)."""
    name: str
    gm: torch.fx.GraphModule
    fake_inputs: list
    fake_mode: FakeTensorMode
    guards: list[tuple[int, object]]
    collective_bytes: dict[str, int]
    artifacts: dict | None
    symbolic: bool

    def output_strides(self) -> list[tuple | None]:
        """The strides of the outputs the code will return: Inductor keeps
        eager's, those of the exported graph run on fakes (the export's own
        values say contiguous where the graph returns a transposed view).
        None where it is not a tensor."""
        with self.fake_mode, torch.no_grad():
            values = self.gm(*self.fake_inputs)
        return [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in values]


def prepare_group(graph: torch._C.Graph, example_inputs: list, name: str, cfg: config.Config,
                  symbolic=None, keep_graph: bool = False) -> PreparedGroup | LoweredGroup:
    """Every stage but code generation (a LoweredGroup when mlir-llvm
    generated the code). ``keep_graph``: keep the exported graph as bytes even
    without the cache (another process generates its code)."""
    dump.write(name, "0.ts.txt", str(graph))
    with _Stage("ts_to_fx"):
        if symbolic is None:
            gm, fake_mode, guards = ts_graph_to_fx(graph, example_inputs)
        else:
            gm, fake_mode, guards = ts_graph_to_fx(graph, example_inputs, symbolic.fake_mode, symbolic.fakes,
                                                   symbolic.size_exprs, symbolic.scalar_exprs)
    # The inputs' real strides (LTC hands over views too): the exported graph's
    # placeholders are contiguous, the code must be compiled for these.
    fake_inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    device = group_device(example_inputs, cfg.device)
    dump.write(name, "1.fx.txt", gm.code)
    with _Stage("fx_to_mlir"):
        module = import_graph(gm, "group", _scalar_values(example_inputs))
    dump.write(name, "2.mlir", str(module))

    def after_pass(pass_name, mod):
        dump.write(name, f"3.after-{pass_name}.mlir", str(mod))

    with _Stage("mlir_passes"):
        mlir_passes.run_pipeline(module, cfg.pipeline, on_pass_done=after_pass if cfg.dump_dir else None)
        mlir_passes.run_pipeline(module, "verify-markers-lowered")  # whatever the configured pipeline
    guards += _specialized_arguments(module, example_inputs)
    if cfg.codegen == "mlir-llvm" and symbolic is None:
        from ..codegen.mlir_llvm import try_compile_module  # MLIR's ExecutionEngine: loaded for this codegen only
        with _Stage("codegen"):
            run = try_compile_module(module, fake_inputs, name, device)
        if run is not None:  # else: unsupported, Inductor compiles the group
            return LoweredGroup(run, guards)
    with _Stage("mlir_to_fx"):
        gm = export_graph(module, "group", fake_mode, device, [t.device for t in fake_inputs],
                          fake_inputs if symbolic is not None else None)
    if cfg.donated_inputs and symbolic is None:  # outputs written into dead inputs' buffers
        donation.write_into_inputs(gm, cfg.donated_inputs, example_inputs)
    if cfg.onednn_linear != "off":  # float32 CPU products only: it reads their values' dtypes and devices
        onednn_linear.rewrite(gm, measured=cfg.onednn_linear == "auto")
    copied_reshapes.rewrite(gm)  # before Inductor folds reshapes into reshapes (static sizes only)
    eager_rounding.rewrite(gm)  # aten's float32 constants in float64 kernels, as eager computes them
    collective_bytes = _collective_bytes(gm)
    if not collective_bytes:  # the zero passes planned a collective group's memory in the layouts it has
        conv_layout.rewrite(gm, fake_inputs, fake_mode)
    dump.write(name, "4.export.fx.txt", gm.code)
    artifacts = _cache_artifacts(gm, cfg) if cfg.cache or keep_graph else None  # before Inductor changes gm
    return PreparedGroup(name, gm, fake_inputs, fake_mode, guards, collective_bytes, artifacts,
                         symbolic is not None)


def through_mlir(gm: torch.fx.GraphModule, inputs: list, pipeline: str) -> torch.fx.GraphModule:
    """An ATen FX graph (ts_to_fx's, or a part of it) through the MLIR passes
    and back, as prepare_group lowers a group, without code generation: run
    eagerly, it shows what the passes did (the minifier shrinks a mismatch
    that arises there with it)."""
    fake_mode, fakes = fake_inputs_of(inputs)
    fake_values(gm, fake_mode, fakes)  # a part's new inputs have no values yet
    module = import_graph(gm, "group", _scalar_values(inputs))
    mlir_passes.run_pipeline(module, pipeline)
    mlir_passes.run_pipeline(module, "verify-markers-lowered")
    return export_graph(module, "group", fake_mode, group_device(inputs, "cpu"), [t.device for t in fakes])


def generate_code(prepared: PreparedGroup, cfg: config.Config) -> LoweredGroup:
    """Inductor's code for a prepared group, in this process."""
    gm = prepared.gm
    stored = prepared.artifacts if cfg.cache else None  # a graph kept for another process only is not stored
    if stored is not None and not cfg.cache_inductor and not prepared.symbolic:
        # Inductor's own cache keys on the graph as given: compile the form a
        # later process loads, so that its compile hits that cache.
        gm = portable_graph.loads(stored["graph"])
    with _Stage("codegen"):  # Inductor: the default, and mlir-llvm's unsupported groups
        run, code, artefact = inductor.compile_graph(gm, prepared.fake_inputs, prepared.fake_mode, prepared.name,
                                                     serializable=stored is not None and cfg.cache_inductor,
                                                     cpp_wrapper=cfg.cpp_wrapper)
    if stored is not None:
        stored["inductor"] = artefact
    dump.write(prepared.name, "5.generated.py", code)
    return LoweredGroup(run, prepared.guards, prepared.collective_bytes, stored)


def adopt_code(prepared: PreparedGroup, artefact: bytes, cfg: config.Config) -> LoweredGroup:
    """The group with the code another process generated for it (Inductor's
    artefact, as ``compile_graph`` returns it). Raises when it cannot be loaded."""
    with _Stage("cache_load"):
        run = inductor.load_artefact(artefact)
    stored = dict(prepared.artifacts, inductor=artefact if cfg.cache_inductor else None) if cfg.cache else None
    return LoweredGroup(run, prepared.guards, prepared.collective_bytes, stored)


def group_device(inputs: list[torch.Tensor], default: str) -> torch.device:
    """The device a group's code runs on: its inputs' (LTC backs a step's
    tensors with one device; a CPU tensor beside them can only be a 0-d
    scalar), else the backend's (a group made only of constants)."""
    devices = [t.device for t in inputs]
    return next((d for d in devices if d.type != "cpu"), devices[0] if devices else torch.device(default))


def _cache_artifacts(gm: torch.fx.GraphModule, cfg: config.Config) -> dict | None:
    """The exported graph as bytes, with what its code generation needs
    besides (read by load_group and the compile workers)."""
    try:
        return {"graph": portable_graph.dumps(gm), "inductor": None, "cpp_wrapper": cfg.cpp_wrapper}
    except Exception as exc:  # noqa: BLE001 - an unpicklable constant costs the cache entry, not the step
        warnings.warn(f"lazy_mlir: a group cannot be stored in the compile cache ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)
        return None


def load_group(artifacts: dict, guards: list, collective_bytes: dict, inputs: list, name: str,
               dynamic=frozenset()) -> LoweredGroup:
    """The executable of a group lowered before (in this or another process):
    Inductor's artefact when there is one, else the exported FX graph compiled
    again (Inductor's own cache makes that cheap), with the ``dynamic``
    (input, dim) sizes symbolic for a shape-generic group. Raises when
    neither works."""
    run = None
    if artifacts.get("inductor") is not None:
        with _Stage("cache_load"):
            try:
                run = inductor.load_artefact(artifacts["inductor"])
            except Exception:  # noqa: BLE001 - e.g. Inductor's format changed: the FX graph still serves
                run = None
                metrics.count_cache("artefact_unusable")
    if run is None:
        with _Stage("cache_load"):
            gm = portable_graph.loads(artifacts["graph"])
            fake_mode, fake_inputs = fake_inputs_of(inputs, dynamic)
        with _Stage("codegen"):
            run, _, _ = inductor.compile_graph(gm, fake_inputs, fake_mode, name,
                                               cpp_wrapper=artifacts.get("cpp_wrapper", False))
    return LoweredGroup(run, list(guards), dict(collective_bytes))


def fake_inputs_of(inputs: list, dynamic=frozenset()) -> tuple[FakeTensorMode, list]:
    """Fakes of the real inputs (shapes, strides, dtypes), as ts_to_fx makes
    them; the ``dynamic`` (input, dim) sizes are symbols of the mode's
    ShapeEnv, one per dim (equalities come from the ops, as guards)."""
    if not dynamic:
        fake_mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
        return fake_mode, [fake_mode.from_tensor(t, static_shapes=True) for t in inputs]
    symbolic_metas.install()
    fake_mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
    fakes = []
    for i, t in enumerate(inputs):
        sizes = [DimDynamic.DYNAMIC if (i, d) in dynamic else DimDynamic.STATIC for d in range(t.dim())]
        fakes.append(fake_mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))
                     if DimDynamic.DYNAMIC in sizes else fake_mode.from_tensor(t, static_shapes=True))
    return fake_mode, fakes


# functional collective -> (kind, argument whose size is moved (None: the
# output), times). An all-reduce counts twice its input (a reduce-scatter and
# an all-gather), as the ZeRO paper counts communication volume.
_COLLECTIVES = {
    torch.ops._c10d_functional.all_gather_into_tensor.default: ("all_gather", None, 1),
    torch.ops._c10d_functional.reduce_scatter_tensor.default: ("reduce_scatter", 0, 1),
    torch.ops._c10d_functional.all_reduce.default: ("all_reduce", 0, 2),
    torch.ops._c10d_functional.all_to_all_single.default: ("all_to_all", 0, 1),
}


def _collective_bytes(gm: torch.fx.GraphModule) -> dict[str, int]:
    """What one run of ``gm`` moves: a gather's output, a reduction's input."""
    moved: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _COLLECTIVES:
            kind, arg, times = _COLLECTIVES[node.target]
            value = (node if arg is None else node.args[arg]).meta["val"]
            moved[kind] = moved.get(kind, 0) + times * value.numel() * value.element_size()
    return moved


def _scalar_values(inputs: list) -> dict[int, dict[str, str]]:
    """Each 0-d input's value as an argument attribute, for specialize-scalars."""
    attrs = {}
    for i, t in enumerate(inputs):
        if t.dim() != 0 or t.dtype == torch.bool:
            continue
        if t.dtype.is_floating_point:
            bits = struct.unpack("<Q", struct.pack("<d", t.item()))[0]  # exact, inf and nan included
            attrs[i] = {VALUE_ATTR: f"0x{bits:016X} : f64"}
        elif not t.dtype.is_complex:
            attrs[i] = {VALUE_ATTR: f"{t.item()} : i64"}
    return attrs


def _specialized_arguments(module, inputs: list) -> list[tuple[int, object]]:
    """Guards for the arguments whose value the passes baked into the code."""
    func = next(op for op in module.body.operations if op.operation.name == "func.func")
    if "arg_attrs" not in func.attributes:
        return []
    return [(i, inputs[i].item()) for i, attrs in enumerate(ir.ArrayAttr(func.attributes["arg_attrs"]))
            if SPECIALIZED_ATTR in ir.DictAttr(attrs)]

