#include "kernels/fill_kernels.h"

#include "kernels/silent_warnings.h"

#include <ATen/ops/full_like_native.h>
#include <ATen/ops/ones_like_native.h>
#include <ATen/ops/select_scatter.h>
#include <ATen/ops/slice_scatter.h>
#include <ATen/ops/zero_native.h>
#include <ATen/ops/zeros_like_native.h>
#include <c10/util/Exception.h>
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

// zero(self) (what functionalization makes of zero_, hence of torch.zeros:
// an empty tensor, zeroed) as zeros of self's shape: LTC's
// node reads self, a fresh host allocation made into device data, so
// every such call was one more input of the step's graph.
at::Tensor zero(const at::Tensor& self) {
  if (auto filled = filledLike(self, 0, std::nullopt, std::nullopt, std::nullopt)) {
    return torch::lazy::CreateAtenFromLtcTensor(filled);
  }
  return at::native::zero(self);
}

// zero_ below functionalization (new_zeros' composite: empty, then zero_):
// the tensor takes the zeros as its value.
at::Tensor& zeroInPlace(at::Tensor& self) {
  torch::lazy::LazyTensorPtr lazy = torch::lazy::TryGetLtcTensor(self);
  TORCH_CHECK(lazy, "lazy_mlir: zero_ of a tensor that is not lazy (", self.device(), ")");
  lazy->SetInPlaceIrValue(
      torch::lazy::LazyGraphExecutor::Get()->GetIrValueForExpandedScalar(0, lazy->shape(), lazy->GetDevice()));
  return self;
}

// Zeros of `input_sizes` with `grad` written into a part of them, as
// slice_backward and select_backward return: an expanded scalar, then LTC's
// own slice_scatter/select_scatter node.
at::Tensor zerosOfSizes(const at::Tensor& grad, c10::SymIntArrayRef input_sizes) {
  torch::lazy::LazyTensorPtr lazy_grad = torch::lazy::TryGetLtcTensor(grad);
  TORCH_CHECK(lazy_grad, "lazy_mlir: a slice/select backward of a tensor that is not lazy (", grad.device(), ")");
  const torch::lazy::Shape shape(grad.scalar_type(), C10_AS_INTARRAYREF_SLOW(input_sizes));
  const torch::lazy::BackendDevice& where = lazy_grad->GetDevice();
  return torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(
      torch::lazy::LazyGraphExecutor::Get()->GetIrValueForExpandedScalar(0, shape, where), where));
}

at::Tensor sliceBackward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim, c10::SymInt start,
                         c10::SymInt end, c10::SymInt step) {
  return at::slice_scatter_symint(zerosOfSizes(grad, input_sizes), grad, dim, std::move(start), std::move(end),
                                  std::move(step));
}

at::Tensor selectBackward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t dim, c10::SymInt index) {
  return at::select_scatter_symint(zerosOfSizes(grad, input_sizes), grad, dim, std::move(index));
}

}  // namespace

void registerFillKernels() {
  static const bool registered = [] {
    // The library must outlive its registrations: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("ones_like", TORCH_FN(onesLike));
    library->impl("zeros_like", TORCH_FN(zerosLike));
    library->impl("full_like", TORCH_FN(fullLike));
    {
      // LTC's own kernels for these read a host-made tensor (zero), or
      // reach torch._decomp's Python decomposition (the backward of every
      // slicing: a causal LM's label shift, x[:, 0]; ~45 us each). Replacing
      // them is intended: the dispatcher's "Overriding a previously
      // registered kernel" warning is silenced.
      SilentWarnings silent;
      c10::WarningUtils::WarningHandlerGuard quiet(&silent);
      library->impl("zero", TORCH_FN(zero));
      library->impl("zero_", TORCH_FN(zeroInPlace));
      library->impl("slice_backward", TORCH_FN(sliceBackward));
      library->impl("select_backward", TORCH_FN(selectBackward));
    }
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
