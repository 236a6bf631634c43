"""Cold compiles of steps with several fusion groups: one after the other
against side by side (``compile_workers``, see lazy_mlir.parallel_compile).

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
import shutil
import sys
import tempfile
import time

from child import exit_if_failed, run_child
from lazy_mlir.config import default_compile_workers

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")


def child(model: str, workers: int, steps: int) -> dict:
    import torch
    import torch._lazy
    sys.path.insert(0, ZOO_DIR)
    import zoo

    import lazy_mlir
    from lazy_mlir import metrics
    lazy_mlir.init("O1", compile_workers=workers)
    v, spec = zoo.base_variant(model, dropout=0.1), zoo.SPECS[model]
    net = zoo.make_model(v, torch.float32).to("lazy")
    net.train()
    opt = spec.optimizer(net)
    torch.manual_seed(0)
    seconds, losses = [], []
    for batch in zoo.batches(v, steps, torch.float32)[:steps]:
        start = time.perf_counter()
        loss = spec.loss(net, *(t.to("lazy") for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
        if len(seconds) == 1:
            after_first = metrics.snapshot()
    s = metrics.snapshot()
    later_calls = s["group_calls"] - after_first["group_calls"]
    later_compiled = s["compiled_group_calls"] - after_first["compiled_group_calls"]
    problems = []
    if s["fallback_count"]:
        problems.append(f"{s['fallback_count']} eager fallbacks")
    if s["groups_fallen_back"]:
        problems.append(f"groups in TorchScript: {sorted(s['groups_fallen_back'])}")
    if later_calls == 0 or later_compiled != later_calls:
        problems.append(f"steps after the first: {later_compiled} of {later_calls} group calls ran generated code")
    if problems:
        raise SystemExit("not compiled: " + "; ".join(problems))
    return {"seconds": seconds, "losses": losses, "groups": s["groups_built"],
            "misses": s["group_cache_misses"], "worker_compiles": s["worker_compiles"],
            "layouts_adapted": s["layouts_adapted"], "recompiles": len(s["recompiles"])}


def run_variant(model: str, workers: int, steps: int) -> dict:
    folder = tempfile.mkdtemp(prefix="lazy_mlir_parallel_")
    env = {"LAZY_MLIR_CACHE_DIR": os.path.join(folder, "lazy"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run_child(__file__, ["--child", model, str(workers), str(steps)])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(folder, ignore_errors=True)


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
        print(json.dumps(child(model, int(workers), int(steps))))
        return
    if args.workers < 1:
        parser.error("--workers must be 1 or more (the parallel variant needs a worker)")
    results = {}
    for model in args.models.split(","):
        for name, workers in (("serial", 0), ("parallel", args.workers)):
            results[f"{model}/{name}"] = run_variant(model, workers, args.steps)
    print(f"\nfirst {args.steps} steps, cold caches, {os.cpu_count()} CPUs, parallel: {args.workers} worker(s)")
    print(f"{'model':<8} {'variant':<9} {'step 0 s':>9} {'later s':>8} {'total s':>8} {'groups':>6} "
          f"{'by workers':>10} {'adapted':>7} {'ratio':>6}")
    for model in args.models.split(","):
        serial, parallel = results[f"{model}/serial"], results[f"{model}/parallel"]
        for name, r in (("serial", serial), ("parallel", parallel)):
            if "failed" in r:
                print(f"{model:<8} {name:<9} FAILED: {r['failed']}")
                continue
            ratio = ""
            if name == "parallel" and "failed" not in serial:
                ratio = f"{sum(r['seconds']) / sum(serial['seconds']):.2f}"
                far = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], serial["losses"])]
                if max(far) > 1e-4:
                    r["failed"] = f"losses differ from serial's by {max(far):.1e}"
                    print(f"{model:<8} {name:<9} FAILED: {r['failed']}")
                    continue
            print(f"{model:<8} {name:<9} {r['seconds'][0]:>9.1f} {sum(r['seconds'][1:]):>8.1f} "
                  f"{sum(r['seconds']):>8.1f} {r['groups']:>6} {r['worker_compiles']:>10} "
                  f"{r['layouts_adapted']:>7} {ratio:>6}")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    exit_if_failed({name: r["failed"] for name, r in results.items() if "failed" in r})


if __name__ == "__main__":
    main()
