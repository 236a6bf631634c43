"""Per-group IR dumps under ``Config.dump_dir`` (LAZY_MLIR_DUMP_DIR).

Files are named ``<group>.<stage>``, e.g. ``graph3.g0.2.mlir``; when
torch.distributed is initialized the global rank follows the group
(``graph3.g0.rank1.2.mlir``), so ranks sharing a directory keep their own.
The directory is checked at ``lazy_mlir.init()``; a dump that fails later
(disk full, permissions changed) is a warning: dumps only observe, they
never change what is compiled or run.
"""
from __future__ import annotations

import os
import tempfile
import warnings

from .. import config

_warned: set[str] = set()  # directories whose write failure was reported


def check_dir(directory: str, source: str = "dump_dir") -> None:
    """Creates ``directory`` if needed and writes a probe file there: a bad
    path is reported at init(), not as a warning at the first compile."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".lazy_mlir_probe.") as probe:
            probe.write("x")
            probe.flush()
    except OSError as exc:
        raise ValueError(f"lazy_mlir: {source} {directory!r} cannot be used for IR dumps: "
                         f"{type(exc).__name__}: {exc}") from exc
    _warned.discard(directory)  # usable again: report the next failure


def rank_suffix() -> str:
    import torch.distributed as dist
    return f".rank{dist.get_rank()}" if dist.is_available() and dist.is_initialized() else ""


def write(group_name: str, stage: str, text: str) -> None:
    directory = config.current.dump_dir
    if not directory:
        return
    path = os.path.join(directory, f"{group_name}{rank_suffix()}.{stage}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except Exception as exc:  # noqa: BLE001 - whatever the cause, a dump must not fail the compile
        try:
            os.remove(path)  # no truncated dump that reads as complete
        except OSError:
            pass
        if directory not in _warned:
            _warned.add(directory)
            warnings.warn(f"lazy_mlir: could not write the IR dump {path} ({type(exc).__name__}: {exc}); "
                          "dumps that fail are skipped (reported once per directory), compilation goes on",
                          RuntimeWarning, stacklevel=2)
