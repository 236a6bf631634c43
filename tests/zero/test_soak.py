"""A short soak of the 3-rank ZeRO workers: the regression check for the
gloo race (zero/groups.py) that aborted about one stage-1 run in five.
The long soak is `tools/zero_soak.py --runs 200` (or `make asan-soak`)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SOAK = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "zero_soak.py")


# Three runs of three ranks each, about 100 s: `pytest -m slow`. make test
# runs stage 1's ranks once (test_zero).
@pytest.mark.slow
def test_short_soak(tmp_path):
    # stage 1 issues the most collectives at once: where the abort showed most
    done = subprocess.run([sys.executable, SOAK, "--runs", "3", "--stages", "1", "--steps", "3",
                           "--logs", str(tmp_path)], capture_output=True, text=True, timeout=900)
    failed = [open(tmp_path / f).read()[-4000:] for f in os.listdir(tmp_path) if f.startswith("failed")]
    assert done.returncode == 0, done.stdout + "\n".join(failed)
    assert "3 runs, 0 failed" in done.stdout
