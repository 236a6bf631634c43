"""A fusion group at run time.

``group_compiler`` is the C++ backend's compile hook: it binds each group to
an executable (``executables``: generated code, or its TorchScript graph as
the fallback), which guards its inputs, compiles on its first run through
the route ``compile.routes`` picks, then calls the code (natively from C++
where it can, as a CUDA graph on a GPU: ``cuda_graphs``). ``numerics_check``
compares a new code's first run with TorchScript's. May import: compile,
cache, lowering, codegen, cluster, observe, config.
"""
