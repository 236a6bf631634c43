"""Per-group IR dumps under ``Config.dump_dir`` (LAZY_MLIR_DUMP_DIR)."""
from __future__ import annotations

import os

from . import config


def write(group_name: str, stage: str, text: str) -> None:
    directory = config.current.dump_dir
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{group_name}.{stage}"), "w") as f:
        f.write(text)
