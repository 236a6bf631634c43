"""A fusion group per layer on models that keep their layers: the cold
compile it saves, and what it costs the warm step (Config.layer_groups,
docs/user-guide.md, "A fusion group per layer").

Per zoo model (tests/models/zoo.py; ``--size deep``: 12 layers x 128, batch
4, 128 tokens, fp32, the zoo's optimizer):

  cold    layer_groups "off" and "on", each in a fresh process with empty
          lazy_mlir and Inductor caches: the first step's seconds (trace,
          lowering, every group's compile), the groups compiled, and the
          median warm step of that process
  paired  one process, two copies of the model with the same weights, one
          traced with "off" and one with "on", taking turns (--block steps
          each, the first of a turn not timed) on the same batches, their
          code loaded from the cold runs' caches: the median step of each,
          the time inside generated code ("graph") and outside it, and the
          largest loss difference between the copies

Ratios between processes drift 10-30% on these machines; the paired ratio
is the step-cost figure. A variant that fell back to TorchScript or eager,
ran no generated code, or whose "on" copy did not get a group per layer
prints FAILED instead of figures, and the script exits 1.

    .venv/bin/python benchmarks/layer_groups.py [--models gpt2,bert,llama,vit] [--size deep] [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from harness import cache_env, check_lazy, emit, exit_if_failed, median_ms, run_child, take_turns, time_steps

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")
MODELS = ("gpt2", "bert", "llama", "vit")
CHOICES = ("off", "on")


def _model_and_batches(name: str, size: str, steps: int):
    import torch
    sys.path.insert(0, ZOO_DIR)
    import zoo
    v = zoo.base_variant(name, size=size)
    spec = zoo.SPECS[name]

    def build():
        model = zoo.make_model(v, torch.float32).to("lazy")  # seed 0: every copy has the same weights
        model.train()
        return model, spec.optimizer(model)
    return build, spec.loss, zoo.batches(v, steps, torch.float32)[:steps]


def _step(model, opt, loss_of):
    import torch._lazy

    def step(batch):
        loss = loss_of(model, *(t.to("lazy") for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        return loss.item()
    return step


def _per_layer(groups_per_graph: dict) -> str | None:
    """Why no graph has a group per layer (None when one has): the "on"
    copy's graph must have more groups than the "off" one's."""
    groups = sorted(groups_per_graph.values())
    if len(groups) == 2 and groups[1] > groups[0] or len(groups) == 1 and groups[0] > 1:
        return None
    return f"no graph with a group per layer (groups per graph {groups_per_graph}; a model needs 2+ layers)"


def cold(name: str, size: str, choice: str, steps: int) -> dict:
    """Runs in the child: one model trained with layer_groups=``choice``."""
    import lazy_mlir
    from lazy_mlir.observe import metrics
    lazy_mlir.init("O1", layer_groups=choice)
    build, loss_of, batches = _model_and_batches(name, size, steps)
    seconds, _ = time_steps(_step(*build(), loss_of), batches)
    s = metrics.snapshot()
    why = check_lazy("O1", snapshot=s) or (_per_layer(s["groups_per_graph"]) if choice == "on" else None)
    if why:
        return {"failed": why}
    return {"first_step_s": seconds[0], "warm_ms": median_ms(seconds, steps // 2),
            "group_compiles": s["group_cache_misses"], "groups": sum(s["groups_per_graph"].values())}


def paired(name: str, size: str, steps: int, warmup: int, block: int) -> dict:
    """Runs in the child: an "off" and an "on" copy taking turns."""
    import lazy_mlir
    from lazy_mlir import config
    from lazy_mlir.observe import metrics
    lazy_mlir.init("O1", layer_groups="off")
    build, loss_of, batches = _model_and_batches(name, size, warmup + steps)
    rows = {}
    for choice in CHOICES:
        model, opt = build()
        # the choice is read once, when the model's first step marks its layers
        config.current.layer_groups = choice
        step = _step(model, opt, loss_of)
        step(batches[0])
        rows[choice] = step
    config.current.layer_groups = "off"
    why = _per_layer(metrics.snapshot()["groups_per_graph"])
    results = take_turns(rows, batches[1:], warmup, block)
    why = why or check_lazy("O1")
    if why:
        return {"failed": why}
    diff = max(abs(a - b) for a, b in zip(results["off"]["losses"], results["on"]["losses"]))
    return {"rows": {c: {"ms": r["ms_per_step"], **r["paired_ms"]} for c, r in results.items()},
            "ratio": results["on"]["ms_per_step"] / results["off"]["ms_per_step"], "max_loss_diff": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--size", default="deep", choices=["tiny", "base", "deep"])
    parser.add_argument("--steps", type=int, default=20, help="timed steps of the paired run")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--cold-steps", type=int, default=8)
    parser.add_argument("--json", default="layer_groups.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # model, "off" / "on" / "paired"
    args = parser.parse_args()
    if args.child:
        name, what = args.child
        emit(paired(name, args.size, args.steps, args.warmup, args.block) if what == "paired"
             else cold(name, args.size, what, args.cold_steps))
        return
    common = ["--size", args.size, "--steps", str(args.steps), "--warmup", str(args.warmup), "--block",
              str(args.block), "--cold-steps", str(args.cold_steps)]
    results, failed = {}, {}
    for name in args.models.split(","):
        folders = {c: tempfile.mkdtemp(prefix=f"layer_groups_{c}_") for c in CHOICES}
        try:
            for choice in CHOICES:
                env = cache_env(f"{folders[choice]}/lazy_mlir", f"{folders[choice]}/inductor")
                results[name, choice] = run_child(__file__, ["--child", name, choice, *common], env=env)
            shutil.copytree(folders["on"], folders["off"], dirs_exist_ok=True)  # both copies' code, warm
            results[name, "paired"] = run_child(__file__, ["--child", name, "paired", *common],
                                                env=cache_env(f"{folders['off']}/lazy_mlir",
                                                              f"{folders['off']}/inductor"))
        finally:
            for folder in folders.values():
                shutil.rmtree(folder, ignore_errors=True)
    for key, r in list(results.items()):
        if "failed" in r:
            failed["/".join(key)] = results.pop(key)["failed"]
    print(f"\nlayer_groups off vs on, --size {args.size}, fp32 (cold: a fresh process, empty caches; paired: "
          f"one process, turns of {args.block} steps, {args.steps} timed)")
    print(f"{'model':<8}{'choice':<7}{'cold 1st step s':>16}{'compiles':>9}{'groups':>7}{'warm ms':>9}"
          f"{'paired ms':>10}{'graph':>8}{'outside':>8}{'on/off':>7}")
    for name in args.models.split(","):
        pair = results.get((name, "paired"))
        for choice in CHOICES:
            c = results.get((name, choice))
            cells = (f"{c['first_step_s']:>16.1f}{c['group_compiles']:>9}{c['groups']:>7}{c['warm_ms']:>9.1f}"
                     if c else f"{'FAILED':>41}")
            if pair:
                row = pair["rows"][choice]
                cells += f"{row['ms']:>10.1f}{row['graph']:>8.1f}{row['outside']:>8.1f}"
                cells += f"{pair['ratio']:>7.2f}" if choice == "on" else ""
            else:
                cells += f"{'FAILED':>26}"
            print(f"{name:<8}{choice:<7}{cells}")
        if pair:
            print(f"{'':<15}max |loss off - loss on| {pair['max_loss_diff']:.1e}")
    with open(args.json, "w") as f:
        json.dump({"/".join(k): v for k, v in results.items()}, f, indent=1)
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
