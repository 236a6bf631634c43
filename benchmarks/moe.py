"""Switch Transformers (Hugging Face, a Python loop over its experts) trained
eagerly, under torch.compile and on the lazy device (lazy_mlir.trace.moe_experts:
the loop in static shapes, every expert on every token), side by side in
one process.

Four copies of one model (the same initial weights) take turns of --turn
steps on the same batches: eager; torch.compile(model) (the loop's
``nonzero``/``where`` break its graph, the experts' token counts vary);
lazy with ``moe_eager_grads`` (experts that got no token get None
gradients, as eagerly: a read before each optimizer step, two graph
executions a step) and lazy without (zero gradients: one graph). AdamW,
fp32. After --warmup steps each, prints the median step time of --steps
timed steps per variant and its ratio to eager, the lazy variants' graph
executions and compiles per timed step, and each variant's largest loss
difference to eager over the first step (the later ones differ by
design between the gradient modes). A lazy variant that ran an op eagerly
or a group in TorchScript prints FAILED.

    .venv/bin/python benchmarks/moe.py [--experts 8] [--hidden 128] [--batch 4] [--length 64] [--steps 12]

2026-12-03, 2 cores, --length 256 --capacity 40 --steps 9: eager 94.1 ms,
torch.compile 1.01x, lazy with eager grads 1.44x, lazy zero grads 1.03x
(docs/performance.md, "Mixture of experts").
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics
from harness import TurnVariant, exit_if_failed, run_in_turns, turn_rows

LAZY = torch.device("lazy")


def build(args) -> torch.nn.Module:
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration
    cfg = SwitchTransformersConfig(vocab_size=args.vocab, d_model=args.hidden, d_kv=args.hidden // 4,
                                   d_ff=4 * args.hidden, num_layers=args.layers,
                                   num_sparse_encoder_layers=args.layers // 2, num_decoder_layers=args.layers,
                                   num_sparse_decoder_layers=args.layers // 2, num_heads=4,
                                   num_experts=args.experts, expert_capacity=args.capacity, dropout_rate=0.0,
                                   router_jitter_noise=0.0, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return SwitchTransformersForConditionalGeneration._from_config(cfg, attn_implementation="eager")


def batches(args) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(2, args.vocab, (args.batch, args.length), generator=g),
             torch.randint(2, args.vocab, (args.batch, args.length // 4), generator=g)) for _ in range(4)]


class Variant(TurnVariant):
    def __init__(self, name, model, device, eager_grads=True):
        super().__init__(name, model, device, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
        self.eager_grads = eager_grads

    def step(self, batch, timed: bool) -> None:
        if self.device == LAZY:
            lazy_mlir.init("O1", moe_eager_grads=self.eager_grads)
            metrics.reset()
        ids, labels = (t.to(self.device) for t in batch)
        start = time.perf_counter()
        decoder_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], 1)
        logits = self.forward(input_ids=ids, decoder_input_ids=decoder_ids).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        self.finish_step(loss, start, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each (half of them MoE)")
    parser.add_argument("--capacity", type=int, default=64, help="tokens per expert per sequence")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--turn", type=int, default=3)
    args = parser.parse_args()
    lazy_mlir.init("O1")
    model = build(args)
    data = batches(args)
    variants = [Variant("eager", copy.deepcopy(model), torch.device("cpu")),
                Variant("torch.compile", copy.deepcopy(model), torch.device("cpu")),
                Variant("lazy, eager grads", copy.deepcopy(model), LAZY),
                Variant("lazy, zero grads", copy.deepcopy(model), LAZY, eager_grads=False)]
    run_in_turns(variants, data, args.warmup, args.steps, args.turn)
    print(f"\nSwitch Transformers {args.layers}+{args.layers} layers (half MoE), {args.experts} experts, "
          f"hidden {args.hidden}, batch {args.batch} x {args.length}, AdamW fp32; median of {args.steps} steps "
          f"after {args.warmup}, turns of {args.turn}")

    def extra(v) -> str:
        line = ""
        if v.per_step:
            execs = statistics.mean(s["graph_executions"] for s in v.per_step)
            compiles = sum(s["compiles"] for s in v.per_step)
            line += f"  {execs:.1f} graph executions a step, {compiles} compiles in the timed steps"
        return line + f"  step-0 |loss - eager| {abs(v.losses[0] - variants[0].losses[0]):.1e}"
    exit_if_failed(turn_rows(variants, 18, extra))


if __name__ == "__main__":
    main()
