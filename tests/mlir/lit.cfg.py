# lit configuration of the MLIR pass tests: `.venv/bin/lit -v tests/mlir`.
# RUN lines use `lazy-mlir-opt` and `filecheck` from the bin directory of the
# Python that runs lit (the project's virtualenv).
import os
import sys

import lit.formats

config.name = "lazy_mlir passes"
config.suffixes = [".mlir"]
config.test_format = lit.formats.ShTest(execute_external=False)
config.test_source_root = os.path.dirname(__file__)
# lit's Output/ and timing files go to the ignored build/ tree.
config.test_exec_root = os.path.join(config.test_source_root, "..", "..", "build", "lit")

_bin = os.path.dirname(sys.executable)
for _tool in ("lazy-mlir-opt", "filecheck"):
    # Only the tool as a word of its own, not inside a path such as %s.
    config.substitutions.append((rf"(?<![\w./-]){_tool}(?![\w./-])", os.path.join(_bin, _tool)))
