// OptimizerChecks: the per-tensor parts of a fused optimizer's step
// (python/lazy_mlir/fused_optimizer.py) that were Python loops over every
// parameter at every step: deciding whether a parameter group is traced as
// one fused node (~29 us for 26 parameters, ~140 for a CNN's 100 small
// ones), and collecting Adam's per-parameter lists.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

namespace lazy_mlir {

// Why the group's tensors keep torch's own path, or nullopt: complex
// parameters, parameters not all floating-point on one lazy device, or (for
// Adam) step counts not on the CPU.
std::optional<std::string> groupTensorsUnfusable(const std::vector<at::Tensor>& params,
                                                 const std::vector<at::Tensor>& state_steps);

// torch.optim.Adam._init_group's work for a group whose parameters with a
// gradient all have their state (every step but the first): appends to the
// lists what it would (each such parameter, its gradient, exp_avg,
// exp_avg_sq, max_exp_avg_sq with amsgrad, step) and returns has_complex.
// Returns None, the lists untouched, where torch's own must run: a state
// missing or empty (it creates it), a key missing, a sparse gradient (it
// raises). `state` is the optimizer's state dict, read without inserting.
pybind11::object collectAdamGroup(const pybind11::list& params, const pybind11::dict& state, bool amsgrad,
                                  const pybind11::list& params_with_grad, const pybind11::list& grads,
                                  const pybind11::list& exp_avgs, const pybind11::list& exp_avg_sqs,
                                  const pybind11::list& max_exp_avg_sqs, const pybind11::list& state_steps);

}  // namespace lazy_mlir
