"""Runs one benchmark variant in a fresh process and brings back its result
or why it failed; a benchmark with a failed variant exits non-zero.

A fresh process per variant gives each its own torch state (a lazy backend,
Dynamo's caches) and its own peak RSS. The child prints its result as JSON on
the last line of its stdout; its stderr, warnings included, streams through.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile


def run_child(script: str, args: list[str], env: dict | None = None) -> dict:
    """``script args`` in a fresh process (``env`` added to ours): its JSON
    result, or {"failed": reason} when it exited non-zero (the reason: its
    last line on stderr)."""
    tail: collections.deque[str] = collections.deque(maxlen=1)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, script, *args], stdout=out, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.strip())
        proc.wait()
        out.seek(0)
        lines = out.read().strip().splitlines()
    if proc.returncode != 0:
        why = tail[0] if tail else "no error message"
        if proc.returncode < 0:
            why = f"killed by signal {-proc.returncode} ({why})"
        return {"failed": why[:300]}
    return json.loads(lines[-1])


def pick_round(rounds: list[dict]) -> dict:
    """A variant's result over interleaved rounds: a failed round if any (a
    lucky round does not hide a failure), else the round with the median
    step time."""
    bad = [r for r in rounds if "failed" in r]
    return bad[0] if bad else sorted(rounds, key=lambda r: r["ms_per_step"])[len(rounds) // 2]


def exit_if_failed(failed: dict[str, str]) -> None:
    """Ends the benchmark with status 1, naming each failed variant and why."""
    if not failed:
        return
    print("\nFAILED variants (no figure printed for them):", file=sys.stderr)
    for name, why in failed.items():
        print(f"  {name}: {why}", file=sys.stderr)
    sys.exit(1)
