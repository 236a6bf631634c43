"""What compiling a fusion group gives: the executable and what it assumes.
Apart from group_lowering (MLIR, fake tensors, Inductor) because a process
that only loads cached code needs this alone."""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class LoweredGroup:
    run: Callable[[list], list]       # list[Tensor] -> list[Tensor]
    guards: list[tuple[int, object]]  # (input index, value) baked into the code
    # Bytes each run moves through collectives, by kind ("all_gather": ...).
    collective_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    # For the persistent cache: {"graph": the exported GraphModule (portable_graph),
    # "inductor": artefact bytes or None}; None when it cannot be stored
    # (mlir-llvm code). compile_cache drops them once written.
    artifacts: dict | None = None
    # The code as a library C++ calls (native_call.Plan) once known: from
    # its first run's probe, or read from the cache with the group, which
    # then runs without loading Inductor.
    native: object | None = None
    disk_key: str | None = None  # the variant's entry in the compile cache, once written


class LoadOnFirstCall:
    """The Python way into code C++ calls as a native library (``native``),
    for a run C++ does not take (native calls off, a scalar input that is
    another tensor now): ``load(inputs)`` gives the Python callable (it
    imports Inductor), at the first such run."""

    def __init__(self, load: Callable[[list], Callable[[list], list]]):
        self.load, self.run = load, None

    def __call__(self, inputs: list) -> list:
        if self.run is None:
            self.run = self.load(inputs)
        return self.run(inputs)

