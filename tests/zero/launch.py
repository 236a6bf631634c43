"""Starts the ranks of a ZeRO test as plain processes (not torchrun, whose
agent would kill the survivors of a crashed rank: the tests check what
they do on their own)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, args: list[str], timeout: float, env: dict | None = None
              ) -> tuple[list[int | None], list[str], float]:
    """Runs worker.py on ``world`` ranks (``env``: variables to add); returns
    (exit codes, None for a rank still running at ``timeout`` and killed;
    outputs; seconds taken)."""
    # PYTHONFAULTHANDLER: a rank killed by a signal prints every thread's stack.
    # The workers' gloo groups take CPU tensors: the lazy device stays the CPU on a GPU machine too.
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "LAZY_MLIR_DEVICE": "cpu", **(env or {})}
    procs = [subprocess.Popen([sys.executable, WORKER, *args], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    start = time.monotonic()
    codes: list[int | None] = []
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            codes.append(None)
        outputs.append(out)
    return codes, outputs, time.monotonic() - start
