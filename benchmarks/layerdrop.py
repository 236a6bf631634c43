"""LayerDrop: a model that skips layers at random, with and without a fusion
group per layer (Config.layer_groups, docs/user-guide.md, "A fusion group per layer").

Trains a tiny Hugging Face M2M100 (encoder and decoder LayerDrop, no
dropout, AdamW, fp32) for a few steps eagerly and on the lazy device, with
layer_groups "off" and "auto", each in a fresh process with an empty
compile cache (every run compiles cold). Prints each step's time, the step
graphs compiled (one per new skip pattern), the groups compiled and served
from the cache, and the largest loss difference to eager. A variant that
fell back to TorchScript or eager, or whose steps did not all run
generated code, prints FAILED instead of figures, and the script exits 1.

    .venv/bin/python benchmarks/layerdrop.py [--steps 8] [--layers 4] [--layerdrop 0.3] [--only auto]
"""
from __future__ import annotations

import argparse

from harness import check_lazy, emit, empty_caches, exit_if_failed, run_child, time_steps

VARIANTS = ("off", "auto")


def child(layer_groups: str, steps: int, layers: int, layerdrop: float) -> dict:
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    import lazy_mlir
    from lazy_mlir.observe import metrics

    lazy_mlir.init("O1", layer_groups=layer_groups)
    config = M2M100Config(vocab_size=128, d_model=32, encoder_layers=layers, decoder_layers=layers,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, max_position_embeddings=64, encoder_layerdrop=layerdrop,
                          decoder_layerdrop=layerdrop, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          pad_token_id=1, decoder_start_token_id=2)

    def train(device):
        torch.manual_seed(0)
        model = M2M100ForConditionalGeneration(config).to(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        src = torch.randint(3, 128, (2, 12), generator=g).to(device)
        tgt = torch.randint(3, 128, (2, 10), generator=g).to(device)
        torch.manual_seed(5)  # the skip patterns

        def step(_):
            loss = model(input_ids=src, labels=tgt).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device.type == "lazy":
                torch._lazy.mark_step()
            return loss.item()
        seconds, losses = time_steps(step, range(steps))
        return losses, seconds

    eager, _ = train(torch.device("cpu"))
    metrics.reset()
    lazy, seconds = train(torch.device("lazy"))
    s = metrics.snapshot()
    why = check_lazy("O1", snapshot=s)
    if why:
        return {"failed": why}
    return {"seconds": seconds, "graph_compiles": s["compiles"], "group_misses": s["group_cache_misses"],
            "group_hits": s["group_cache_hits"], "groups": sum(s["groups_per_graph"].values()),
            "max_loss_diff": max(abs(a - b) for a, b in zip(eager, lazy))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layerdrop", type=float, default=0.3)
    parser.add_argument("--only", help=f"variants (default: {','.join(VARIANTS)})")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(child(args.child, args.steps, args.layers, args.layerdrop))
        return
    results = {}
    for variant in (args.only.split(",") if args.only else VARIANTS):
        with empty_caches() as env:
            results[variant] = run_child(__file__, ["--child", variant, "--steps", str(args.steps), "--layers",
                                                    str(args.layers), "--layerdrop", str(args.layerdrop)], env)
    print(f"\nM2M100, {args.layers}+{args.layers} layers, layerdrop {args.layerdrop}, {args.steps} steps, cold "
          f"(seconds per step; graph compiles = skip patterns traced; group compiles / cache hits)")
    failed = {}
    for variant, r in results.items():
        if "failed" in r:
            failed[variant] = r["failed"]
            print(f"  layer_groups={variant:<5} FAILED: {r['failed']}")
            continue
        steps = " ".join(f"{t:.2f}" for t in r["seconds"])
        print(f"  layer_groups={variant:<5} total {sum(r['seconds']):7.1f} s  steps [{steps}]  "
              f"graph compiles {r['graph_compiles']}  group compiles {r['group_misses']} / hits {r['group_hits']}  "
              f"max |loss - eager| {r['max_loss_diff']:.1e}")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
