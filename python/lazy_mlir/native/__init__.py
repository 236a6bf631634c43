"""The C++ extension, ``_C``: our LTC backend (lazy_backend/) and the group
runtime (runtime/), built by CMake into this folder.

It wraps the TorchScript LTC backend: graph clustering, binding compiled
groups into ``prim::CallMethod`` of ``CompiledGroup`` objects, trace-time
kernels and nodes, the corrections to stock LTC, buffer donation, and native
calls of generated code. Python reaches it as ``from ..native import _C``;
it calls back into Python only through the hooks ``backend.init`` installs
(``_C.set_hooks``). Imports nothing of the package.
"""
