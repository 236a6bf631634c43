"""What runs while the user's step is traced on the lazy device.

Lazy-key kernels for ops the TorchScript LTC backend cannot trace
(``lazy_kernels``), ``torch.autocast("lazy")`` (``autocast``), Adam, AdamW and
SGD steps as one traced node (``fused_optimizer``), whole-module capture
(``capture``), the first step's setup so it traces the steady-state graph
(``steady_state``), tied parameters (``module_ties``), ``torch.lazy``
(``device_module``), model-library compatibility (``transformers_compat``,
``moe_experts``) and a failed step's cleanup (``step_errors``).
May import: cluster, lowering (the optimizer ops' definitions), observe,
config and the C++ extension; never run, compile or cache.
"""
