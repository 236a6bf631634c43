"""The numerics checker (``init(check=True)``, ``LAZY_MLIR_CHECK=1``).

The first run of each group's newly compiled (or loaded) code (executables,
which counts the verdicts in ``metrics``) also runs the
group's TorchScript subgraph, the O0 reference, on copies of the same
inputs, and compares the outputs. A mismatch is reported (a warning and
``metrics``) with the group, the ops whose outputs differ and their source
lines; the group then runs in TorchScript from that run on (its outputs are
the reference's), so training goes on correctly; the case (the group's
graph and inputs) is written to a file that ``python -m lazy_mlir.minify``
shrinks into a standalone reproducer.

An output disagrees when it differs by more than both (a) a tolerance of
the least precise floating dtype anywhere in the group (inputs,
intermediates, outputs: float64 throughout, 1e-9 of the output's largest
value; a part in float32, as a model's rotary tables, 1e-4) and (b) ten
times its noise floor: how much the reference itself moves when the inputs
are moved by a few units in their last place (an Adam step divides a
gradient by its own square root: where gradients are rounding noise, so
is the update, in any correct code); an output beyond it is measured
against more moves before it is called a mismatch. Integer and boolean
outputs must be equal. Costs two TorchScript runs and two copies of the
inputs per new code (up to seven runs more where a difference needs
confirming), nothing on later runs.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time

import torch

from ..lowering import portable_graph

# (rtol, atol), applied to the largest magnitude of each output: generated
# code sums in other orders than aten (reductions, fused multiply-adds)
TOLERANCES = {torch.float64: (1e-9, 1e-12), torch.float32: (1e-4, 1e-6),
              torch.bfloat16: (4e-2, 1e-3), torch.float16: (1e-2, 1e-4)}
_PRECISION_ORDER = [torch.float64, torch.float32, torch.float16, torch.bfloat16]  # tighter first


def least_precise_float(dtypes) -> torch.dtype | None:
    """The least precise floating dtype among ``dtypes``."""
    floats = [d for d in dtypes if d in TOLERANCES]
    return max(floats, key=_PRECISION_ORDER.index) if floats else None


@functools.cache
def _arguments(schema: str) -> list:
    return torch._C.parse_schema(schema).arguments


# c10::ScalarType codes of the float dtypes, as a dtype argument's constant holds them
_SCALAR_TYPES = {5: torch.float16, 6: torch.float32, 7: torch.float64, 15: torch.bfloat16}


def graph_float(graph: torch._C.Graph, tensors: list = ()) -> torch.dtype | None:
    """The least precise float dtype a TorchScript group computes in: of its
    typed values, of ``tensors`` (its inputs and outputs: LTC's graphs type
    most values as a plain Tensor) and of the casts inside it (a dtype
    argument, as ``_to_copy``'s or ``softmax``'s)."""
    values = list(graph.inputs()) + [v for n in graph.nodes() for v in n.outputs()]
    dtypes = [v.type().dtype() for v in values if isinstance(v.type(), torch._C.TensorType)]
    dtypes += [t.dtype for t in tensors if isinstance(t, torch.Tensor)]
    for node in graph.nodes():
        if not node.kind().startswith("aten::"):
            continue
        schema = node.schema()
        if schema == "(no schema)":
            continue
        for argument, value in zip(_arguments(schema), node.inputs()):
            if argument.name == "dtype" and value.node().kind() == "prim::Constant":
                dtypes.append(_SCALAR_TYPES.get(value.toIValue()))
    return least_precise_float(dtypes)


def fx_float(gm: torch.fx.GraphModule, inputs: list) -> torch.dtype | None:
    """The least precise float dtype of an FX graph's inputs and values."""
    dtypes = [t.dtype for t in inputs if isinstance(t, torch.Tensor)]
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.kwargs.get("dtype"), torch.dtype):
            dtypes.append(node.kwargs["dtype"])  # a cast, where the graph carries no meta (a minifier trial)
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor):
                dtypes.append(v.dtype)
    return least_precise_float(dtypes)


def graph_tolerance(graph: torch._C.Graph, tensors: list = ()) -> tuple[float, float]:
    """(rtol, atol) for a TorchScript group: by the least precise dtype it computes in."""
    return TOLERANCES.get(graph_float(graph, tensors), TOLERANCES[torch.float32])


def fx_tolerance(gm: torch.fx.GraphModule, inputs: list) -> tuple[float, float]:
    """(rtol, atol) for an FX graph: by its inputs' and values' dtypes."""
    return TOLERANCES.get(fx_float(gm, inputs), TOLERANCES[torch.float32])


def perturbed(inputs: list, computes_in: torch.dtype | None = None, seed: int = 0) -> list:
    """Copies of ``inputs`` whose floating values are moved by a few units
    in their last place (random signs): what rounding alone can change.
    Units of ``computes_in`` where the graph computes in a less precise
    dtype than an input's: a float64 input cast to float32 inside would
    absorb a move in float64's last place, and its floor would miss the
    float32 rounding (Adam's update of a near-zero gradient amplifies it).
    0-d inputs stay: they are the step's Python numbers (LTC passes each as
    a 0-d tensor), exact as written; moving one changes the program, not
    its rounding (the exponent 1 of ``pow``'s backward, moved, gives NaN
    for every negative base)."""
    g = torch.Generator().manual_seed(seed)
    moved = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim():
            eps = torch.finfo(t.dtype).eps
            if computes_in is not None and computes_in.is_floating_point:
                eps = max(eps, torch.finfo(computes_in).eps)
            eps *= ROUNDING_ULPS
            signs = torch.randint(0, 2, t.shape, generator=g).to(t.device, t.dtype) * 2 - 1
            moved.append(t * (1 + eps * signs))
        else:
            moved.append(t.clone() if isinstance(t, torch.Tensor) else t)
    return moved


# Inputs are moved by this many units in the last place to measure each
# output's rounding noise; a difference within NOISE_FACTOR times it is
# rounding (the zoo tests hold real models to the same noise floor).
ROUNDING_ULPS = 4
NOISE_FACTOR = 10


# A difference beyond the first run's noise floor is held against the
# floors of up to this many more moves before it is called a mismatch: one
# move may leave a value that is rounding alone where it was (an Adam step
# turns a gradient that is rounding into a full step of either sign, and a
# move flips that sign only about half the time).
CONFIRMING_MOVES = 7


def differences_beyond_noise(inputs: list, reference: list, run_reference, computes_in, differing) -> tuple:
    """(what ``differing(floors)`` returns, the floors) once the floors are
    measured: by one move of ``inputs`` (perturbed) through ``run_reference``,
    and where something differs beyond it, by up to CONFIRMING_MOVES more
    (each output's floor is its largest change over the moves). Costs one
    reference run where nothing differs."""
    floors = noise_floors(reference, run_reference(perturbed(inputs, computes_in)))
    found = differing(floors)
    for seed in range(1, CONFIRMING_MOVES + 1):
        if not found:
            break
        more = noise_floors(reference, run_reference(perturbed(inputs, computes_in, seed)))
        floors = [max(a, b) for a, b in zip(floors, more)]
        found = differing(floors)
    return found, floors


def noise_floors(reference: list, moved_reference: list) -> list[float]:
    """Per output, the largest change that rounding of the inputs made."""
    floors = []
    for want, moved in zip(reference, moved_reference):
        if isinstance(want, torch.Tensor) and isinstance(moved, torch.Tensor) and want.is_floating_point() \
                and want.shape == moved.shape and want.numel():
            diff = (moved.detach().cpu().double() - want.detach().cpu().double())
            finite = torch.isfinite(diff)
            floors.append(diff[finite].abs().max().item() if finite.any() else 0.0)
        else:
            floors.append(0.0)
    return floors


def compare_values(outputs: list, reference: list, tolerance: tuple[float, float],
                   floors: list[float] | None = None) -> list[tuple[int, float, float]]:
    """(output, largest difference, the reference's largest magnitude) for
    each output that disagrees beyond ``tolerance`` and NOISE_FACTOR times
    its noise floor (``floors``, per output); a difference of inf: other
    shape, dtype, NaNs or infinities, or unequal integers."""
    rtol, atol = tolerance
    found = []
    for k, (got, want) in enumerate(zip(outputs, reference)):
        floor = NOISE_FACTOR * floors[k] if floors is not None else 0.0
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
            continue
        if got.shape != want.shape or got.dtype != want.dtype:
            found.append((k, float("inf"), 0.0))
        elif want.numel() == 0:
            continue
        elif not want.is_floating_point():
            if not torch.equal(got.cpu(), want.cpu()):
                found.append((k, float("inf"), 0.0))
        else:
            got64, want64 = got.detach().cpu().double(), want.detach().cpu().double()
            finite = torch.isfinite(want64)
            if not torch.equal(torch.isfinite(got64), finite) or \
                    not torch.equal(got64[~finite].nan_to_num(0.0), want64[~finite].nan_to_num(0.0)):
                found.append((k, float("inf"), 0.0))
                continue
            scale = want64[finite].abs().max().item() if finite.any() else 0.0
            max_diff = (got64 - want64)[finite].abs().max().item() if finite.any() else 0.0
            if max_diff > max(atol + rtol * scale, floor):
                found.append((k, max_diff, scale))
    return found


@dataclasses.dataclass
class Mismatch:
    output: int
    max_diff: float
    scale: float        # the reference's largest magnitude
    op: str             # the node that produces the output, with its source line


def compare(graph: torch._C.Graph, outputs: list, reference: list, floors: list[float]) -> list[Mismatch]:
    """The outputs of a group's generated code that differ from TorchScript's
    (``floors``: each output's rounding noise, see noise_floors)."""
    producers = [v.node() for v in graph.outputs()]
    return [Mismatch(k, d, scale, _op(producers[k]))
            for k, d, scale in compare_values(outputs, reference, graph_tolerance(graph, reference), floors)]


def _op(node: torch._C.Node) -> str:
    if node.kind() in ("prim::TupleUnpack", "prim::ListUnpack"):
        node = node.inputsAt(0).node()
    where = node.s("source") if node.hasAttribute("source") else None
    if where:
        parts = where.rsplit(" ", 2)
        where = f"{parts[0]}:{parts[2]} ({parts[1]})" if len(parts) == 3 else where
    return node.kind() + (f" at {where}" if where else "")


def report(name: str, describe: str, mismatches: list[Mismatch], case_path: str | None, stage: str) -> str:
    """The warning's text, also kept by ``metrics``."""
    shown = []
    for m in mismatches[:5]:
        size = f"{m.max_diff:.3g} off (largest value {m.scale:.3g})" if m.max_diff != float("inf") else "differs"
        shown.append(f"output {m.output} from {m.op}: {size}")
    more = f" and {len(mismatches) - 5} more outputs" if len(mismatches) > 5 else ""
    text = (f"lazy_mlir check: fusion group {name}'s generated code disagrees with TorchScript: "
            f"{'; '.join(shown)}{more} (stage at fault: {stage}). The group runs in TorchScript from now on. Group: [{describe}]")
    if case_path:
        text += f". Reproduce and shrink it: python -m lazy_mlir.minify {case_path}"
    return text


def save_case(graph: torch._C.Graph, inputs: list, reference: list, floors: list[float], name: str, cfg,
              prepare_group) -> tuple[str | None, str]:
    """Finds the stage at fault (``ts_to_fx``, ``mlir``: the passes and the
    export, or ``codegen``) by running each stage's FX graph eagerly on the
    inputs, and writes that graph, the inputs and the options where
    ``python -m lazy_mlir.minify`` reads them: (path or None, stage).
    ``prepare_group``: group_lowering's, which the caller holds."""
    from ..lowering.ts_to_fx import ts_graph_to_fx  # here: only a mismatch loads the lowering

    tolerance = graph_tolerance(graph, [*inputs, *reference])
    stage, gm = "codegen", None
    try:
        first, _, _ = ts_graph_to_fx(graph, [_detached(t) for t in inputs])
        if compare_values(list(first(*[_detached(t) for t in inputs])), reference, tolerance, floors):
            stage, gm = "ts_to_fx", first
        else:
            local = dataclasses.replace(cfg, dump_dir=None, cache=False)
            prepared = prepare_group(graph, [_detached(t) for t in inputs], name, local)
            if not hasattr(prepared, "fake_inputs"):
                gm = first  # mlir-llvm generated the code: nothing exported to shrink
            elif compare_values(list(prepared.gm(*[_detached(t) for t in inputs])), reference, tolerance, floors):
                stage, gm = "mlir", first
            else:
                gm = prepared.gm
    except Exception as exc:  # noqa: BLE001 - the report stands without the stage
        stage = f"unknown ({type(exc).__name__}: {exc})"
    folder = cfg.dump_dir or os.path.join(os.getcwd(), "lazy_mlir_checks")
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{name}.{time.strftime('%Y%m%d-%H%M%S')}.case.pt")
        options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "dump_dir"}
        torch.save({"name": name, "stage": stage, "graph": portable_graph.dumps(gm) if gm is not None else None,
                    "ts_graph": str(graph), "inputs": [_detached(t) for t in inputs], "options": options}, path)
        return path, stage
    except (OSError, RuntimeError, TypeError):
        return None, stage


def _detached(t):
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t
