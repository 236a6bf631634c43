#include "optimizer_checks.h"

namespace lazy_mlir {

std::optional<std::string> groupTensorsUnfusable(const std::vector<at::Tensor>& params,
                                                 const std::vector<at::Tensor>& state_steps) {
  for (const at::Tensor& step : state_steps) {
    if (!step.device().is_cpu()) return "step counts not on the CPU";
  }
  for (const at::Tensor& p : params) {
    if (p.is_complex()) return "complex parameters";
  }
  if (params.empty()) return std::nullopt;
  const c10::Device device = params[0].device();
  for (const at::Tensor& p : params) {
    const at::ScalarType t = p.scalar_type();
    const bool floating = t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble;
    if (device.type() != c10::kLazy || p.device() != device || !floating) {
      return "parameters not all floating-point on one lazy device";
    }
  }
  return std::nullopt;
}

}  // namespace lazy_mlir
