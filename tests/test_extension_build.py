"""The C++ extension as built on this machine shares the process's one
libstdc++. A compiler that links libstdc++ statically into it (seen: the
GCC in /opt/gcc on the lent GPU machines) gives _C its own copy of the
iostream and locale code; the first std::ostream that torch writes for _C
then segfaults (hashing a traced builtin's constants: every fused optimizer
step). Such a copy shows in the symbols _C exports."""
import shutil
import subprocess

import pytest

from lazy_mlir.native import _C

LIBSTDCXX_OWN = ("_ZNSt6locale", "_ZNKSt7codecvt", "_ZNSt7codecvt")  # std::locale, std::codecvt members


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_extension_carries_no_copy_of_libstdcxx():
    symbols = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True,
                             check=True).stdout.split()
    copied = [s for s in symbols if s.startswith(LIBSTDCXX_OWN)]
    assert not copied, (f"{_C.__file__} holds its own libstdc++ ({len(copied)} symbols such as {copied[0]}): "
                        "its compiler links libstdc++ statically, and the extension will crash in torch's "
                        "iostreams. Rebuild it with the system compiler, e.g. CXX=/usr/bin/g++ make setup")
