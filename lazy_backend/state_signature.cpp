#include "state_signature.h"

#include <string>

namespace lazy_mlir {

pybind11::object stateSignature(const std::vector<at::Tensor>& tensors) {
  std::string bytes;
  bytes.reserve(tensors.size() * 32);
  auto put = [&](int64_t value) { bytes.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  for (const at::Tensor& t : tensors) {
    if (t.device().type() != c10::kLazy) return pybind11::none();
    // one word of dtype, requires_grad and rank, then the sizes: no two signatures share bytes
    put(static_cast<int64_t>(t.scalar_type()) | (int64_t{t.requires_grad()} << 8) | (t.dim() << 16));
    for (int64_t size : t.sizes()) put(size);
  }
  return pybind11::bytes(bytes);
}

}  // namespace lazy_mlir
