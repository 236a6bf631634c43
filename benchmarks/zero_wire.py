"""ZeRO-3 bytes on the wire, measured: N gloo ranks on this machine, the
loopback interface's byte counter around the timed steps.

lazy_mlir counts a step's collective bytes from its compiled graph
(``metrics["collective_bytes"]``: an all-gather's output, an all-to-all's
input, as the ZeRO paper counts them; benchmarks/zero_simulation.py reports
the same count at 1,024 ranks). This script checks that count against what
the ranks really send: gloo's ring all-gather and pairwise all-to-all send
(N - 1)/N of those bytes from each rank, over TCP on the loopback interface
when the ranks share a machine, so the interface's transmitted bytes
(``/proc/net/dev``, all ranks together) over the timed steps, divided by N,
should be ``(N - 1)/N * collective_bytes`` per rank and step, plus TCP/IP
and gloo headers and the barriers around the steps. Needs an otherwise quiet
loopback (Linux).

A hybrid row ``RxS`` (R replicas of S-rank shard groups) gathers and
reduce-scatters in groups of S ((S - 1)/S of those bytes sent) and
all-reduces gradient shards across R ranks (gloo's ring all-reduce sends
2 (R - 1)/R of its input, which lazy_mlir counts twice: (R - 1)/R of it).

    .venv/bin/python benchmarks/zero_wire.py [--worlds 2,4,2x2] [--steps 4] [--warmup 2]

A run that fails, or whose steps fell back (an eager op, a group in
TorchScript, more than one graph a step), shows FAILED and exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

# all-gather output / all-to-all input bytes: a rank sends (N - 1)/N of them
RING_KINDS = ("all_gather", "all_to_all", "reduce_scatter")


def _loopback_sent() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])  # transmitted bytes
    raise RuntimeError("no loopback interface in /proc/net/dev")


def _rank(shard_group: int, steps: int, warmup: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import lazy_mlir
    import lazy_mlir.zero as zero
    from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lazy_mlir.init(progress=False)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=256, vocab_size=2048, block_size=64, batch_size=4 * world)
    model = make_gpt(config)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model, optimizer = zero.initialize(model.to("lazy"), make_adamw(model), stage=3, prefetch_bytes=1 << 20,
                                       shard_group_size=shard_group)
    rows = config.batch_size // world
    sent = None
    for step, (x, y) in enumerate(gpt_batches(config, steps=warmup + steps)):
        if step == warmup:
            dist.barrier()
            sent = _loopback_sent()
            lazy_mlir.metrics.reset()
        loss = model(x[rank * rows:(rank + 1) * rows].to("lazy"), y[rank * rows:(rank + 1) * rows].to("lazy"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
    torch._lazy.wait_device_ops()
    dist.barrier()
    sent = _loopback_sent() - sent
    s = lazy_mlir.metrics.snapshot()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "param_bytes": param_bytes, "loopback_sent": sent, "steps": steps,
                       "collective_bytes": {k: v / steps for k, v in s["collective_bytes"].items()},
                       "fell_back": [s["fallback_count"], bool(s["groups_fallen_back"]),
                                     s["graph_executions"] != s["mark_steps"]]}, f)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world(spec: str) -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"RxS"`` -> (R * S, S)."""
    replicas, _, shards = spec.partition("x")
    return (int(replicas) * int(shards), int(shards)) if shards else (int(spec), int(spec))


def _run(spec: str, steps: int, warmup: int) -> dict:
    world, _ = _world(spec)
    out = f"/tmp/zero_wire_{os.getpid()}_{world}.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world),
           "OMP_NUM_THREADS": "1", "LAZY_MLIR_DEVICE": "cpu"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank-of", spec, "--steps", str(steps),
                               "--warmup", str(warmup), "--out", out],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs) or not os.path.exists(out):
        return {"world": world, "error": next((o for p, o in zip(procs, outputs) if p.returncode), "")[-300:]}
    with open(out) as f:
        row = json.load(f)
    os.remove(out)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,2x2", help="N, or RxS: R replicas of S-rank shard groups")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)  # a rank of a launched run: "N" or "RxS"
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        _rank(_world(args.rank_of)[1], args.steps, args.warmup, args.out)
        return 0
    print("| N | counted bytes a step (per rank) | expected on the wire | measured on the "
          "loopback, per rank | measured / expected | counted vs ZeRO's volume |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for spec in args.worlds.split(","):
        world, shards = _world(spec)
        replicas = world // shards
        row = _run(spec, args.steps, args.warmup)
        why = row.get("error") or (f"fell back: {row['fell_back']}" if any(row["fell_back"]) else None)
        counted = row.get("collective_bytes", {})
        # the all-reduce across replicas is the only one (no parameter is kept whole here)
        modelled = set(RING_KINDS) | ({"all_reduce"} if replicas > 1 else set())
        if not why and set(counted) - modelled:
            why = f"collectives of kinds {sorted(set(counted) - modelled)}, whose wire bytes this script does not model"
        if why:
            print(f"| {spec} | FAILED: {why} |")
            failed = 1
            continue
        total = sum(counted.values())
        across = counted.get("all_reduce", 0)
        expected = (total - across) * (shards - 1) / shards + across * (replicas - 1) / replicas
        measured = row["loopback_sent"] / world / row["steps"]
        volume = 3 + (2 / shards if replicas > 1 else 0)  # ZeRO-3 in the group, + the shards' all-reduce
        print(f"| {spec} | {total:,.0f} | {expected:,.0f} | {measured:,.0f} | {measured / expected:.3f} | "
              f"{total / row['param_bytes'] / volume:.3f} |")
    return failed


if __name__ == "__main__":
    sys.exit(main())
