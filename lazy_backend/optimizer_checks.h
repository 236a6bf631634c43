// OptimizerChecks: the per-tensor part of deciding whether an optimizer's
// parameter group is traced as one fused node (python/lazy_mlir/
// fused_optimizer.py). In Python these were loops over every parameter at
// every step: ~29 us for 26 parameters, ~140 for a CNN's 100 small
// ones.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace lazy_mlir {

// Why the group's tensors keep torch's own path, or nullopt: complex
// parameters, parameters not all floating-point on one lazy device, or (for
// Adam) step counts not on the CPU.
std::optional<std::string> groupTensorsUnfusable(const std::vector<at::Tensor>& params,
                                                 const std::vector<at::Tensor>& state_steps);

}  // namespace lazy_mlir
