// Matrix products of CPU groups on oneDNN (codegen/onednn_linear.py rewrites
// a group's float32 products into these ops and registers their fake
// kernels):
//   lazy_mlir::onednn_linear(x, weight, bias) = x @ weight.t() + bias, by
//     oneDNN's inner product (mkldnn::_linear_pointwise, the weight not
//     prepacked): forward linears and input gradients;
//   lazy_mlir::onednn_matmul(a, b) = a @ b for 2-D or 3-D (batched) a and b,
//     by oneDNN's matmul primitive (at::native::mkldnn_matmul), which takes
//     either operand transposed without a copy: weight gradients t(dY) @ X
//     and attention's bmm.
// The kernels are C++, not Python: the generated code calls them through the
// dispatcher with the GIL released, and a Python kernel would take the GIL
// back on every call (behind a background compile's thread, up to Python's
// switch interval each time).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace at::native {
// Exported by libtorch_cpu (TORCH_API in ATen/native/mkldnn/Matmul.h, a header
// the wheel does not ship): result = beta * result + alpha * mat1 @ mat2. In
// float32 it keeps float32 arithmetic unless torch's oneDNN matmul precision
// is set lower (torch.backends.mkldnn.matmul.fp32_precision).
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result, float beta,
                             float alpha);
}  // namespace at::native

namespace {

at::Tensor onednnLinear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  // Boxed: one call per product, and the boxed form needs no C++ signature of
  // an op whose schema torch may extend.
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(weight);
  stack.emplace_back(bias);
  stack.emplace_back(std::string("none"));                    // attr: no fused activation
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());  // its scalars
  stack.emplace_back(std::string(""));                        // algorithm
  op.callBoxed(&stack);
  return std::move(stack.back()).toTensor();
}

at::Tensor onednnMatmul(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == b.dim() && (a.dim() == 2 || a.dim() == 3), "lazy_mlir::onednn_matmul: 2-D or 3-D operands, got ",
              a.sizes(), " and ", b.sizes());
  std::vector<int64_t> sizes = a.sizes().vec();
  sizes.back() = b.size(-1);
  at::Tensor result = at::empty(sizes, a.options());
  at::native::mkldnn_matmul(a, b, result, /*beta=*/0.0f, /*alpha=*/1.0f);
  return result;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lazy_mlir, m) {
  m.def("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("onednn_matmul(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(lazy_mlir, CPU, m) {
  m.impl("onednn_linear", &onednnLinear);
  m.impl("onednn_matmul", &onednnMatmul);
}
