"""Soak test for the ZeRO workers: runs tests/zero/worker.py on 3 gloo ranks
again and again (stages 1-3 in turn) and keeps the whole output of every run
where a rank did not exit 0, so a rare abort can be read in full.

    .venv/bin/python tools/zero_soak.py --runs 200 --logs /tmp/zero_soak

Prints one line per run and a summary: runs, failures, and the upper bound
of the per-run failure rate at 95% confidence when none failed (3/runs).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "zero"))
from launch import run_ranks  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--logs", default=os.path.join(tempfile.gettempdir(), "zero_soak"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--stop-on-failure", action="store_true")
    args, worker_args = parser.parse_known_args()
    os.makedirs(args.logs, exist_ok=True)
    stages = [int(s) for s in args.stages.split(",")]
    failures = 0
    start = time.monotonic()
    for run in range(args.runs):
        stage = stages[run % len(stages)]
        out = os.path.join(args.logs, f"run{run}")
        codes, outputs, took = run_ranks(args.world, ["--stage", str(stage), "--steps", str(args.steps),
                                                      "--out", out, *worker_args], timeout=args.timeout)
        ok = codes == [0] * args.world
        for rank in range(args.world):
            path = f"{out}.rank{rank}"
            if os.path.exists(path):
                os.remove(path)
        if not ok:
            failures += 1
            log = os.path.join(args.logs, f"failed_run{run}_stage{stage}.log")
            with open(log, "w") as f:
                for rank, text in enumerate(outputs):
                    f.write(f"===== rank {rank}: exit {codes[rank]} =====\n{text}\n")
        print(f"run {run} stage {stage}: exit codes {codes} in {took:.1f}s" + ("" if ok else f" -> {log}"),
              flush=True)
        if not ok and args.stop_on_failure:
            break
    runs = run + 1
    print(f"{runs} runs, {failures} failed, {time.monotonic() - start:.0f}s", end="")
    print(f"; no failure: per-run failure rate < {min(1.0, 3 / runs):.3f} at 95% confidence" if not failures else "")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
