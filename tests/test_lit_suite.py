"""The MLIR pass tests (tests/mlir/*.mlir: lit + FileCheck) as part of pytest."""
import pathlib
import subprocess
import sys

LIT = pathlib.Path(sys.executable).with_name("lit")  # installed beside python, like filecheck
SUITE = pathlib.Path(__file__).parent / "mlir"


def test_lit_suite_passes():
    result = subprocess.run([str(LIT), "-v", str(SUITE)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
