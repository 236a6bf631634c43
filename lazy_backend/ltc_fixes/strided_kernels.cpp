#include "ltc_fixes/strided_kernels.h"

#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_ops.h>
#include <torch/csrc/lazy/core/metrics.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

#include "kernels/silent_warnings.h"

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

at::Tensor emptyStrided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device,
                        std::optional<bool> pin_memory) {
  TORCH_LAZY_COUNTER("lazy::empty_strided_symint", 1);  // LTC's kernel's counter, which users read
  // The elements the strides reach: the last one's offset, plus one.
  c10::SymInt span = 1;
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == 0) empty = true;
    span += (size[i] - 1) * stride[i];
  }
  // LTC's empty itself (as LTC's empty_strided calls it), not the
  // dispatcher's front, which functionalization would wrap a second time.
  const c10::SymInt elements = empty ? c10::SymInt(0) : span;
  at::Tensor storage = at::_ops::empty_memory_format::redispatch(
      c10::DispatchKeySet(c10::DispatchKey::Lazy), c10::SymIntArrayRef(&elements, 1), dtype, layout, device,
      pin_memory, std::nullopt);
  return storage.as_strided_symint(size, stride, 0);
}

}  // namespace

void registerStridedKernels() {
  static const bool registered = [] {
    SilentWarnings silent;  // replacing LTC's empty_strided is intended
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    // The library must outlive its registration: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("as_strided_", TORCH_FN(asStridedInPlace));
    library->impl("empty_strided", TORCH_FN(emptyStrided));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
