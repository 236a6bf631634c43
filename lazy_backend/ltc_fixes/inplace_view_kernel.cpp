#include "ltc_fixes/inplace_view_kernel.h"

#include <ATen/ops/as_strided_native.h>
#include <torch/library.h>

namespace lazy_mlir {

void registerInplaceViewKernel() {
  static const bool registered = [] {
    // The library must outlive its registration: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("as_strided_", TORCH_FN(at::native::as_strided__symint));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
