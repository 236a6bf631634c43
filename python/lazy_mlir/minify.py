"""Shrinks a numerics-check mismatch into a standalone reproducer.

``python -m lazy_mlir.minify CASE [-o repro.py]``: CASE is the file the
checker (numerics_check, ``init(check=True)``) wrote for a group whose
generated code disagreed with TorchScript. The checker already found the
stage at fault (``ts_to_fx``, ``mlir``: the passes and the export, or
``codegen``); for code generation the group's exported FX graph is shrunk
while the mismatch holds, as torch.compile's accuracy minifier does:

1. one disagreeing output is kept (the one with the fewest ops behind it);
2. ops are cut off the graph's front, each cut op becoming an input that
   carries the value eager computed for it (halves of the ops first, then
   smaller chunks, down to one at a time);
3. an earlier op that already disagrees becomes the output, and 2 again.

The result is one Python file: the small graph (its FX code, and the graph
itself as bytes), its inputs, and a check that compiles it as lazy_mlir
does and compares with eager; it exits 1 while the defect is there.
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
    into inputs do not change it)."""
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            values[node] = torch.utils._pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) else t, result)
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


def _codegen_disagrees(graph: bytes, inputs: list, options: dict) -> bool:
    """Whether lazy_mlir's code for a graph disagrees with eager (the checker's tolerances)."""
    # the compiler: in the trial worker only
    from .codegen import inductor
    from .lowering.group_lowering import fake_inputs_of

    gm = portable_graph.loads(graph)
    try:
        reference = list(gm(*_copies(inputs)))
        fake_mode, fakes = fake_inputs_of(inputs)
        run, _, _ = inductor.compile_graph(gm, fakes, fake_mode, "minify", cpp_wrapper=options.get("cpp_wrapper"))
        outputs = run(_copies(inputs))
        found, _ = numerics_check.differences_beyond_noise(
            inputs, reference, lambda moved: list(gm(*moved)), numerics_check.fx_float(gm, inputs),
            lambda floors: numerics_check.compare_values(outputs, reference, numerics_check.fx_tolerance(gm, inputs),
                                                         floors))
    except Exception:  # noqa: BLE001 - another failure than the one being shrunk
        return False
    return bool(found)


def _serve(connection, imports: list[str]) -> None:
    import importlib

    # lazy_mlir's ops are there: unpickling this function imported the package
    for name in imports:  # the user's own op libraries
        importlib.import_module(name)
    while True:
        job = connection.recv()
        if job is None:
            return
        connection.send(_codegen_disagrees(*job))


class CodegenTrials:
    """Runs each trial in a worker process (spawned, restarted after a
    crash): a defect that writes out of bounds kills the worker, not the
    minifier, and counts as reproduced."""

    def __init__(self, options: dict, imports: list[str] = ()):
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
            self.connection.send((portable_graph.dumps(gm), list(inputs), self.options))
            return self.connection.recv()
        except (EOFError, ConnectionError, OSError):
            self.worker.join()
            self.worker = None
            return True

    def close(self) -> None:
        if self.worker is not None:
            self.connection.send(None)
            self.worker.join()


_SCRIPT = '''"""A reproducer lazy_mlir.minify wrote from {case}: lazy_mlir's generated
code for this graph disagrees with eager PyTorch (stage: {stage}).
Run it: python {script}  (exit 1: the defect is there; 0: it is not)

The graph ({ops} ops):
{code}
"""
import base64
import io
import sys

import torch

import lazy_mlir  # noqa: F401 - registers lazy_mlir's ops
{imports}from lazy_mlir.lowering import portable_graph
from lazy_mlir.run import numerics_check
from lazy_mlir.codegen import inductor
from lazy_mlir.lowering.group_lowering import fake_inputs_of

GRAPH = base64.b64decode("{graph}")
INPUTS = torch.load(io.BytesIO(base64.b64decode("{inputs}")), weights_only=False)
CPP_WRAPPER = {cpp_wrapper}


def main() -> int:
    gm = portable_graph.loads(GRAPH)
    reference = list(gm(*[t.clone() for t in INPUTS]))
    fake_mode, fakes = fake_inputs_of(INPUTS)
    run, code, _ = inductor.compile_graph(gm, fakes, fake_mode, "repro", cpp_wrapper=CPP_WRAPPER)
    outputs = run([t.clone() for t in INPUTS])
    tolerance = numerics_check.fx_tolerance(gm, INPUTS)
    bad, _ = numerics_check.differences_beyond_noise(
        INPUTS, reference, lambda moved: list(gm(*moved)), numerics_check.fx_float(gm, INPUTS),
        lambda floors: numerics_check.compare_values(outputs, reference, tolerance, floors))
    for k, max_diff, scale in bad:
        print(f"output {{k}}: {{max_diff:.3g}} off (largest value {{scale:.3g}})")
    print("MISMATCH" if bad else "agrees with eager")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write_script(path: str, case_path: str, stage: str, gm: fx.GraphModule, inputs: list, options: dict,
                 imports: list[str] = ()) -> None:
    buffer = io.BytesIO()
    torch.save([t.detach().clone() for t in inputs], buffer)
    code = "\n".join("    " + line for line in gm.code.strip().splitlines())
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    with open(path, "w") as f:
        f.write(_SCRIPT.format(case=case_path, stage=stage, script=path, ops=ops, code=code.replace('"""', "'''"),
                               graph=base64.b64encode(portable_graph.dumps(gm)).decode(),
                               inputs=base64.b64encode(buffer.getvalue()).decode(),
                               cpp_wrapper=bool(options.get("cpp_wrapper")),
                               imports="".join(f"import {name}  # noqa: F401\n" for name in imports)))


def minify_case(case_path: str, out_path: str | None = None, imports: list[str] = (), log=print) -> str | None:
    """Shrinks the checker's case file; returns the reproducer's path (None
    when the stage at fault is not code generation: the case file is then
    the report). ``imports``: modules to import before compiling (the
    user's own op libraries), in the trials and in the reproducer."""
    case = torch.load(case_path, weights_only=False)
    stage = case["stage"]
    log(f"{case['name']}: the mismatch arises in {stage}")
    if stage != "codegen":
        log(f"only code generation's graphs are shrunk: attach {case_path} to the report")
        return None
    gm = portable_graph.loads(case["graph"])
    inputs = case["inputs"]
    check = CodegenTrials(case["options"], imports)
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
