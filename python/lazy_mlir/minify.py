"""Shrinks a numerics-check mismatch into a standalone reproducer.

``python -m lazy_mlir.minify CASE [-o repro.py]``: CASE is the file the
checker (numerics_check, ``init(check=True)``) wrote for a group whose
generated code disagreed with TorchScript. The checker already found the
stage at fault (``ts_to_fx``, ``mlir``: the passes and the export, or
``codegen``) and saved the graph that goes into it: for code generation
the group's exported FX graph, for the MLIR passes ts_to_fx's graph of the
group. That graph is shrunk while the mismatch holds (compiled by Inductor,
or taken through the passes and back and run eagerly), as torch.compile's
accuracy minifier does:

1. one disagreeing output is kept (the one with the fewest ops behind it);
2. ops are cut off the graph's front, each cut op becoming an input that
   carries the value eager computed for it (halves of the ops first, then
   smaller chunks, down to one at a time);
3. an earlier op that already disagrees becomes the output, and 2 again.

The result is one Python file: the small graph (its FX code, and the graph
itself as bytes), its inputs, and a check that puts it through the stage
at fault as lazy_mlir does and compares with eager; it exits 1 while the
defect is there. A mismatch in ts_to_fx (TorchScript's graph against its
FX translation) is not shrunk: the case file is the report.
Each trial compiles in a worker process: a defect that crashes it (an
out-of-bounds write) counts as reproduced, and the worker is restarted.
"""
from __future__ import annotations

import argparse
import base64
import io
import multiprocessing
import sys
import time

import torch
import torch.fx as fx

from .lowering import portable_graph
from .run import numerics_check


def shrink(gm: fx.GraphModule, inputs: list, mismatches, log=print) -> tuple[fx.GraphModule, list]:
    """The smallest subgraph of ``gm`` (with its inputs) for which
    ``mismatches(gm, inputs)`` still holds."""
    values = _node_values(gm, inputs)
    outputs = [n for n in _outputs(gm) if isinstance(values.get(n), torch.Tensor)]
    candidates = sorted(outputs, key=lambda n: len(_ancestors(n)))
    target = next((n for n in candidates if mismatches(*_subgraph(gm, [n], set(), values))), None)
    if target is None:
        log("no single output disagrees alone: the whole graph is kept")
        return gm, inputs
    cuts: set = set()
    while True:
        cuts = _cut_front(gm, target, cuts, values, mismatches, log)
        earlier = _earliest_disagreeing(gm, target, cuts, values, mismatches)
        if earlier is None:
            break
        log(f"{earlier.name} already disagrees: it is the output now")
        target = earlier
    return _subgraph(gm, [target], cuts, values)


def _cut_front(gm, target, cuts, values, mismatches, log) -> set:
    chunk = max(1, len(_ops_of(gm, target, cuts, values)) // 2)
    while True:
        ops = _ops_of(gm, target, cuts, values)
        changed = False
        for i in range(0, len(ops), chunk):
            trial = cuts | set(ops[i:i + chunk])
            if mismatches(*_subgraph(gm, [target], trial, values)):
                cuts, changed = trial, True
                log(f"  {len(_ops_of(gm, target, cuts, values)) + 1} ops left")
                break
        if not changed:
            if chunk == 1:
                return cuts
            chunk = max(1, chunk // 2)


def _earliest_disagreeing(gm, target, cuts, values, mismatches):
    for node in _ops_of(gm, target, cuts, values):
        if mismatches(*_subgraph(gm, [node], cuts, values)):
            return node
    return None


def _ops_of(gm, target, cuts, values) -> list[fx.Node]:
    """The ops computing ``target`` (itself left out) that could be cut: tensor-valued."""
    needed = _needed([target], cuts)
    return [n for n in gm.graph.nodes if n in needed and n.op == "call_function" and n is not target
            and n not in cuts and isinstance(values.get(n), torch.Tensor)]


def _needed(outputs, cuts) -> set:
    needed, stack = set(), list(outputs)
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        if node not in cuts and node.op == "call_function":
            stack.extend(node.all_input_nodes)
    return needed


def _ancestors(node) -> set:
    return _needed([node], set())


def _outputs(gm) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a for a in torch.utils._pytree.tree_leaves(out.args[0]) if isinstance(a, fx.Node)]


def _node_values(gm, inputs) -> dict:
    """Every node's eager value (copied when made: later in-place writes
    into inputs do not change it; contiguous, as every lazy value is: a cut
    value becomes an input of the smaller graph, and a transposed one would
    make a mismatch of its own)."""
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            values[node] = torch.utils._pytree.tree_map(
                lambda t: t.clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t,
                result)
            return result

    Recorder(gm).run(*_copies(inputs))
    return values


def _subgraph(gm, outputs, cuts, values) -> tuple[fx.GraphModule, list]:
    """``outputs`` computed from the graph's inputs, its constants and the
    ``cuts`` (inputs now, with their eager values)."""
    graph, env, inputs = fx.Graph(), {}, []
    needed = _needed(outputs, cuts)
    for node in gm.graph.nodes:
        if node not in needed:
            continue
        if node.op in ("placeholder", "get_attr") or node in cuts:
            env[node] = graph.placeholder(node.name)
            inputs.append(values[node])
        elif node.op == "call_function":
            env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[o] for o in outputs))
    return fx.GraphModule(torch.nn.Module(), graph), inputs


def _copies(inputs):
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]


# the stages whose input graph can be shrunk
STAGES = ("codegen", "mlir")


def through_stage(stage: str, gm: fx.GraphModule, inputs: list, options: dict):
    """``gm`` as the stage at fault makes it, a callable list -> list:
    Inductor's code (codegen), or the graph the MLIR passes give back, run
    eagerly (mlir)."""
    # the compilers: in the trial worker and the reproducer only
    if stage == "mlir":
        from .lowering.group_lowering import through_mlir
        lowered = through_mlir(gm, inputs, options["pipeline"])
        return lambda xs: list(lowered(*xs))
    from .codegen import inductor
    from .lowering.group_lowering import fake_inputs_of
    fake_mode, fakes = fake_inputs_of(inputs)
    run, _, _ = inductor.compile_graph(gm, fakes, fake_mode, "minify", cpp_wrapper=options.get("cpp_wrapper"))
    return run


def disagreements(stage: str, gm: fx.GraphModule, inputs: list, options: dict) -> list:
    """(output, difference, largest value) for each output of ``gm`` that the
    stage makes disagree with eager beyond the checker's tolerances."""
    reference = list(gm(*_copies(inputs)))
    outputs = through_stage(stage, gm, inputs, options)(_copies(inputs))
    tolerance = numerics_check.fx_tolerance(gm, inputs)
    found, _ = numerics_check.differences_beyond_noise(
        inputs, reference, lambda moved: list(gm(*moved)), numerics_check.fx_float(gm, inputs),
        lambda floors: numerics_check.compare_values(outputs, reference, tolerance, floors))
    return found


def _disagrees(stage: str, graph: bytes, inputs: list, options: dict) -> bool:
    try:
        return bool(disagreements(stage, portable_graph.loads(graph), inputs, options))
    except Exception:  # noqa: BLE001 - another failure than the one being shrunk
        return False


def _serve(connection, imports: list[str]) -> None:
    import importlib

    # lazy_mlir's ops are there: unpickling this function imported the package
    for name in imports:  # the user's own op libraries
        importlib.import_module(name)
    while True:
        job = connection.recv()
        if job is None:
            return
        connection.send(_disagrees(*job))


class Trials:
    """Runs each trial of ``stage`` in a worker process (spawned, restarted
    after a crash): a defect that writes out of bounds kills the worker,
    not the minifier, and counts as reproduced."""

    def __init__(self, stage: str, options: dict, imports: list[str] = ()):
        self.stage = stage
        self.options = options
        self.imports = list(imports)
        self.worker = None

    def __call__(self, gm: fx.GraphModule, inputs: list) -> bool:
        if self.worker is None:
            context = multiprocessing.get_context("spawn")
            self.connection, child = context.Pipe()
            self.worker = context.Process(target=_serve, args=(child, self.imports), daemon=True)
            self.worker.start()
        try:
            self.connection.send((self.stage, portable_graph.dumps(gm), list(inputs), self.options))
            return self.connection.recv()
        except (EOFError, ConnectionError, OSError):
            self.worker.join()
            self.worker = None
            return True

    def close(self) -> None:
        if self.worker is not None:
            self.connection.send(None)
            self.worker.join()


_SCRIPT = '''"""A reproducer lazy_mlir.minify wrote from {case}: lazy_mlir's {what}
for this graph disagrees with eager PyTorch (stage: {stage}).
Run it: python {script}  (exit 1: the defect is there; 0: it is not)

The graph ({ops} ops):
{code}
"""
import base64
import io
import sys

import torch

import lazy_mlir  # noqa: F401 - registers lazy_mlir's ops
{imports}from lazy_mlir import minify
from lazy_mlir.lowering import portable_graph

GRAPH = base64.b64decode("{graph}")
INPUTS = torch.load(io.BytesIO(base64.b64decode("{inputs}")), weights_only=False)
OPTIONS = {options!r}


def main() -> int:
    bad = minify.disagreements("{stage}", portable_graph.loads(GRAPH), INPUTS, OPTIONS)
    for k, max_diff, scale in bad:
        print(f"output {{k}}: {{max_diff:.3g}} off (largest value {{scale:.3g}})")
    print("MISMATCH" if bad else "agrees with eager")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
'''

# what each stage makes of the graph, for the reproducer's first line
_WHAT = {"codegen": "generated code", "mlir": "MLIR passes (and the export back to FX)"}


def write_script(path: str, case_path: str, stage: str, gm: fx.GraphModule, inputs: list, options: dict,
                 imports: list[str] = ()) -> None:
    buffer = io.BytesIO()
    torch.save([t.detach().clone() for t in inputs], buffer)
    code = "\n".join("    " + line for line in gm.code.strip().splitlines())
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    with open(path, "w") as f:
        f.write(_SCRIPT.format(case=case_path, stage=stage, what=_WHAT[stage], script=path, ops=ops,
                               code=code.replace('"""', "'''"), graph=base64.b64encode(portable_graph.dumps(gm)).decode(),
                               inputs=base64.b64encode(buffer.getvalue()).decode(),
                               options={k: options[k] for k in ("pipeline", "cpp_wrapper") if k in options},
                               imports="".join(f"import {name}  # noqa: F401\n" for name in imports)))


def minify_case(case_path: str, out_path: str | None = None, imports: list[str] = (), log=print) -> str | None:
    """Shrinks the checker's case file; returns the reproducer's path (None
    when the stage at fault is ts_to_fx, or unknown: the case file is then
    the report). ``imports``: modules to import before compiling (the
    user's own op libraries), in the trials and in the reproducer."""
    case = torch.load(case_path, weights_only=False)
    stage = case["stage"]
    log(f"{case['name']}: the mismatch arises in {stage}")
    if stage not in STAGES or case["graph"] is None:
        log(f"only the graphs of {' and '.join(STAGES)} are shrunk: attach {case_path} to the report")
        return None
    gm = portable_graph.loads(case["graph"])
    inputs = case["inputs"]
    check = Trials(stage, case["options"], imports)
    start = time.perf_counter()
    try:
        if not check(gm, inputs):
            log("the case no longer disagrees here (fixed, or another environment)")
            return None
        small, small_inputs = shrink(gm, inputs, check, log)
    finally:
        check.close()
    out_path = out_path or case_path.replace(".case.pt", "") + ".repro.py"
    write_script(out_path, case_path, stage, small, small_inputs, case["options"], imports)
    ops = sum(1 for n in small.graph.nodes if n.op == "call_function")
    log(f"wrote {out_path}: {ops} ops, in {time.perf_counter() - start:.0f} s")
    return out_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazy_mlir.minify", description=__doc__.splitlines()[0])
    parser.add_argument("case", help="the .case.pt file the numerics checker wrote")
    parser.add_argument("-o", "--output", help="the reproducer's path (default: beside the case)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="a module to import before compiling (one that registers your own ops); repeatable")
    args = parser.parse_args(argv)
    return 0 if minify_case(args.case, args.output, args.imports) else 1


if __name__ == "__main__":
    sys.exit(main())
