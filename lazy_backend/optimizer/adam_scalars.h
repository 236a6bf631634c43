// Adam's per-step bookkeeping for lazy_mlir.trace.fused_optimizer, in one call:
// each parameter's CPU step count advanced (Adam's `step_t += 1`) and the
// per-step scalars computed as torch's single-tensor Adam does in Python
// doubles, one lazy device-data tensor per distinct step count.
//
// In Python this was ~5 us per parameter (a foreach add over 0-d CPU
// tensors, stack + tolist, one device-data tensor per parameter): 10-20% of
// a small model's optimizer step. One tensor per distinct count (not one
// per parameter) also leaves the step's graph one input instead of one per
// parameter.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace lazy_mlir {

// [1 - lr * weight_decay, bias_correction2 ** 0.5, -lr / bias_correction1]
// for one step count (the entries lowering/fused_optimizer.py reads).
std::vector<double> adamStepScalars(double step, double lr, double weight_decay, double beta1, double beta2);

// Adds 1 to each 0-d CPU tensor of `state_steps` in place (bumping its
// version, as an in-place op does), then returns the scalars of each
// distinct new count as a float64 [3] lazy tensor on `device`, and for each
// step count the index of its tensor.
std::pair<std::vector<at::Tensor>, std::vector<int64_t>> advanceAdamSteps(const std::vector<at::Tensor>& state_steps,
                                                                         double lr, double weight_decay, double beta1,
                                                                         double beta2, const c10::Device& device);

}  // namespace lazy_mlir
