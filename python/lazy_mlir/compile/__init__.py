"""When and where a fusion group compiles.

``routes`` is the policy: for a new group, which of the compile routes runs
(in this process, in a worker process, beside its graph's other groups, in
the background, shape-generic). The routes sit beside it: ``isolated`` (a
group's whole compile in a worker), ``parallel`` (a graph's groups side by
side, its ``worker`` processes), ``background`` (a thread, the step runs
TorchScript meanwhile), ``shape_generic`` (one compile serves every size).
``heap`` gives a compile's freed memory back. May import: cache, lowering,
codegen, cluster, observe, config.
"""
