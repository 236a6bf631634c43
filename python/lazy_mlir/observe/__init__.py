"""What lazy_mlir did, for the user: ``metrics`` (traces, compiles, cache
hits, executions, fallbacks), ``syncs`` (where a step is cut into more
than one graph execution and why, the user's source lines) and ``dump``
(per-group IR dumps). The lowest stage: it may import only config and the
C++ extension.
"""
