#include "kernels/safe_softmax_kernel.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace lazy_mlir {

namespace {

// aten's composite kernel, op for op, with where.self for where.self_out.
at::Tensor safeSoftmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  at::Tensor out = at::softmax(self, dim, dtype);
  at::Tensor masked_rows = at::all(at::isneginf(self), dim, /*keepdim=*/true);
  at::Tensor zero = at::scalar_tensor(0.0, out.options());
  return at::where(masked_rows, zero, out);
}

}  // namespace

void registerSafeSoftmaxKernel() {
  static const bool registered = [] {
    // The library must outlive its registration: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("_safe_softmax", TORCH_FN(safeSoftmax));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
