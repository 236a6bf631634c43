#include "fill_kernels.h"

#include <ATen/ops/full_like_native.h>
#include <ATen/ops/ones_like_native.h>
#include <ATen/ops/zeros_like_native.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

namespace lazy_mlir {

namespace {

// The lazy tensor a fill of `self`'s shape with `value` gives, or nullptr
// where the options ask for something else (another device, a non-strided
// layout): aten's composite kernel serves those.
torch::lazy::LazyTensorPtr filledLike(const at::Tensor& self, const at::Scalar& value,
                                      std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                      std::optional<at::Device> device) {
  if ((device && device->type() != c10::kLazy) || (layout && *layout != at::kStrided)) return nullptr;
  torch::lazy::LazyTensorPtr lazy_self = torch::lazy::TryGetLtcTensor(self);
  if (!lazy_self) return nullptr;
  const torch::lazy::Shape shape(dtype.value_or(self.scalar_type()), self.sizes());
  const torch::lazy::BackendDevice& where = lazy_self->GetDevice();
  return torch::lazy::LazyTensor::Create(
      torch::lazy::LazyGraphExecutor::Get()->GetIrValueForExpandedScalar(value, shape, where), where);
}

at::Tensor onesLike(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                    std::optional<at::Device> device, std::optional<bool> pin_memory,
                    std::optional<at::MemoryFormat> memory_format) {
  if (auto filled = filledLike(self, 1, dtype, layout, device)) return torch::lazy::CreateAtenFromLtcTensor(filled);
  return at::native::ones_like(self, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor zerosLike(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool> pin_memory,
                     std::optional<at::MemoryFormat> memory_format) {
  if (auto filled = filledLike(self, 0, dtype, layout, device)) return torch::lazy::CreateAtenFromLtcTensor(filled);
  return at::native::zeros_like(self, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor fullLike(const at::Tensor& self, const at::Scalar& fill_value, std::optional<at::ScalarType> dtype,
                    std::optional<at::Layout> layout, std::optional<at::Device> device,
                    std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  if (auto filled = filledLike(self, fill_value, dtype, layout, device)) {
    return torch::lazy::CreateAtenFromLtcTensor(filled);
  }
  return at::native::full_like(self, fill_value, dtype, layout, device, pin_memory, memory_format);
}

}  // namespace

void registerFillKernels() {
  static const bool registered = [] {
    // The library must outlive its registrations: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("ones_like", TORCH_FN(onesLike));
    library->impl("zeros_like", TORCH_FN(zerosLike));
    library->impl("full_like", TORCH_FN(fullLike));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
