"""Cold compiles of steps with several fusion groups: one after the other
against side by side (``compile_workers``, see lazy_mlir.compile.parallel).

Models nobody on the team wrote, as users train them: the test zoo's
Hugging Face GPT-2, BERT and T5 with dropout 0.1 (HF's default), fp32,
AdamW. Dropout's random draws stay in TorchScript, so each step has several
groups (GPT-2 and BERT 5, T5 15). Each (model, variant) runs in its own
process with empty lazy_mlir and Inductor caches:

  serial    compile_workers=0: each group compiles at its first run
  parallel  compile_workers=N (default: the machine's default, half the
            CPUs, at most 4): the first step runs the groups in TorchScript
            and their code is generated at the step's end, here and in
            worker processes

Per model and variant: the first step's seconds, the next steps' (a group
whose inputs came in another layout than its compile took would compile
again there), groups compiled, by workers, with inputs adapted, and the
ratio parallel / serial of the first ``--steps`` steps' total. Losses must
agree between the variants (fp32: 1e-4 relative). A variant with an eager
fallback, a group left in TorchScript, or a timed step not all in generated
code gets no figure, and the script exits 1.

    .venv/bin/python benchmarks/parallel_compile.py [--models gpt2,bert,t5] [--steps 3] [--workers N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from harness import Col, Table, emit, empty_caches, exit_if_failed, not_compiled, run_child, time_steps
from lazy_mlir.config import default_compile_workers

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")


def child(model: str, workers: int, steps: int) -> dict:
    import torch
    import torch._lazy
    sys.path.insert(0, ZOO_DIR)
    import zoo

    import lazy_mlir
    from lazy_mlir.observe import metrics
    lazy_mlir.init("O1", compile_workers=workers)
    v, spec = zoo.base_variant(model, dropout=0.1), zoo.SPECS[model]
    net = zoo.make_model(v, torch.float32).to("lazy")
    net.train()
    opt = spec.optimizer(net)
    torch.manual_seed(0)
    after_first = {}

    def step(batch):
        loss = spec.loss(net, *(t.to("lazy") for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        return loss.item()
    seconds, losses = time_steps(step, zoo.batches(v, steps, torch.float32)[:steps], 1,
                                 at_warmup=lambda: after_first.update(metrics.snapshot()))
    s = metrics.snapshot()
    later_calls = s["group_calls"] - after_first["group_calls"]
    later_compiled = s["compiled_group_calls"] - after_first["compiled_group_calls"]
    # the first step runs groups in TorchScript while their code is generated (parallel): not a failure
    why = not_compiled(s, "O1")
    if not why and (later_calls == 0 or later_compiled != later_calls):
        why = f"steps after the first: {later_compiled} of {later_calls} group calls ran generated code"
    if why:
        return {"failed": why}
    return {"seconds": seconds, "losses": losses, "groups": s["groups_built"],
            "misses": s["group_cache_misses"], "worker_compiles": s["worker_compiles"],
            "layouts_adapted": s["layouts_adapted"], "recompiles": len(s["recompiles"])}


def run_variant(model: str, workers: int, steps: int) -> dict:
    with empty_caches("lazy_mlir_parallel_") as env:
        return run_child(__file__, ["--child", model, str(workers), str(steps)], env)


def _table(serial: dict, failed: dict) -> Table:
    """One model's rows; ``serial``: its serial row, the ratio's base."""
    return Table([Col("step 0 s", 9, lambda r: r["seconds"][0]), Col("later s", 9, lambda r: sum(r["seconds"][1:])),
                  Col("total s", 9, lambda r: sum(r["seconds"])), Col("groups", 7, "groups", "d"),
                  Col("by workers", 11, "worker_compiles", "d"), Col("adapted", 8, "layouts_adapted", "d"),
                  Col("ratio", 7, lambda r: "" if r is serial or "failed" in serial
                      else f"{sum(r['seconds']) / sum(serial['seconds']):.2f}")],
                 names=(("model", 9), ("variant", 10)), failed=failed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,bert,t5")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=default_compile_workers())
    parser.add_argument("--json", default="parallel_compile.json")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, workers, steps = args.child
        emit(child(model, int(workers), int(steps)))
        return
    if args.workers < 1:
        parser.error("--workers must be 1 or more (the parallel variant needs a worker)")
    results = {}
    for model in args.models.split(","):
        for name, workers in (("serial", 0), ("parallel", args.workers)):
            results[f"{model}/{name}"] = run_variant(model, workers, args.steps)
    print(f"\nfirst {args.steps} steps, cold caches, {os.cpu_count()} CPUs, parallel: {args.workers} worker(s)")
    failed = {}
    for k, model in enumerate(args.models.split(",")):
        serial, parallel = results[f"{model}/serial"], results[f"{model}/parallel"]
        if "failed" not in serial and "failed" not in parallel:
            far = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(parallel["losses"], serial["losses"]))
            if far > 1e-4:
                parallel["failed"] = f"losses differ from serial's by {far:.1e}"
        table = _table(serial, failed)
        if k == 0:
            table.header()
        table.row(serial, model, "serial")
        table.row(parallel, model, "parallel")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
