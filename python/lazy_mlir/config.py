"""User-visible configuration of lazy_mlir, set by ``lazy_mlir.init()``."""
from __future__ import annotations

import dataclasses
import os

LEVELS = {"O0": 0, "O1": 1, "O2": 2}


@dataclasses.dataclass
class Config:
    # O0: TorchScript runs everything (the reference); O1: fusion groups of
    # compilable ops (default); O2: the whole step as one group, or an error.
    level: str = "O1"
    # Where per-group IR dumps go (None: no dumps). LAZY_MLIR_DUMP_DIR sets it.
    dump_dir: str | None = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_DUMP_DIR"))

    def validate(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"lazy_mlir: level must be one of {sorted(LEVELS)}, got {self.level!r}")


current = Config()
