#include "ltc_fixes/inplace_view_kernel.h"

#include <ATen/ops/as_strided_native.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

namespace lazy_mlir {

namespace {

const at::Tensor& asStridedInPlace(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                   std::optional<c10::SymInt> storage_offset) {
  // An LTC tensor has no storage to set strides over (aten's kernel would
  // read it): refused as a resize is, so that a composite kernel calling it
  // is traced another way (lazy_kernels._refusal).
  TORCH_CHECK(torch::lazy::TryGetLtcTensor(self) == nullptr,
              "lazy_mlir: aten::as_strided_ of a lazy tensor: the lazy device cannot resize it");
  return at::native::as_strided__symint(self, size, stride, std::move(storage_offset));
}

}  // namespace

void registerInplaceViewKernel() {
  static const bool registered = [] {
    // The library must outlive its registration: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("as_strided_", TORCH_FN(asStridedInPlace));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
