#include "optimizer/adam_scalars.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/lazy/backend/backend_device.h>
#include <torch/csrc/lazy/core/tensor.h>

#include <cmath>

namespace lazy_mlir {

std::vector<double> adamStepScalars(double step, double lr, double weight_decay, double beta1, double beta2) {
  // Python's float ** is C's pow (not sqrt for ** 0.5): the same doubles.
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  return {1 - lr * weight_decay, std::pow(bias_correction2, 0.5), -(lr / bias_correction1)};
}

namespace {

void checkStepCount(const at::Tensor& step) {
  TORCH_CHECK(step.device().is_cpu() && step.numel() == 1 && !step.requires_grad(),
              "lazy_mlir: an Adam step count that is not a plain CPU scalar tensor (", step.device(), ", ",
              step.numel(), " elements)");
}

// step_t += 1 on a checked step count; returns the new count as Adam's .item().
double advance(const at::Tensor& step) {
  double count;
  if (step.scalar_type() == at::kFloat) {  // the default (_get_scalar_dtype)
    float* value = step.data_ptr<float>();
    *value = *value + 1.0f;  // add_(1) in float, as aten's
    count = *value;
  } else if (step.scalar_type() == at::kDouble) {
    double* value = step.data_ptr<double>();
    *value = *value + 1.0;
    count = *value;
  } else {
    step.add_(1);
    return step.item<double>();
  }
  torch::autograd::impl::bump_version(step);
  return count;
}

}  // namespace

std::pair<std::vector<at::Tensor>, std::vector<int64_t>> advanceAdamSteps(const std::vector<at::Tensor>& state_steps,
                                                                         double lr, double weight_decay, double beta1,
                                                                         double beta2, const c10::Device& device) {
  const torch::lazy::BackendDevice backend_device = torch::lazy::atenDeviceToBackendDevice(device);
  std::vector<double> counts;  // distinct, in order of first appearance
  std::vector<at::Tensor> scalars;
  std::vector<int64_t> rows;
  rows.reserve(state_steps.size());
  for (const at::Tensor& step : state_steps) checkStepCount(step);  // all, before the first is advanced
  for (const at::Tensor& step : state_steps) {
    const double count = advance(step);
    size_t row = 0;
    while (row < counts.size() && counts[row] != count) ++row;  // a group has one or a few counts
    if (row == counts.size()) {
      counts.push_back(count);
      at::Tensor values = at::empty({3}, at::TensorOptions().dtype(at::kDouble));
      const auto computed = adamStepScalars(count, lr, weight_decay, beta1, beta2);
      std::copy(computed.begin(), computed.end(), values.data_ptr<double>());
      // (its data moves to the device when the tensor is first traced)
      scalars.push_back(
          torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(values, backend_device)));
    }
    rows.push_back(static_cast<int64_t>(row));
  }
  return {std::move(scalars), std::move(rows)};
}

}  // namespace lazy_mlir
