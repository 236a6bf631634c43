// lazy_mlir::onednn_linear(x, weight, bias) = x @ weight.t() + bias, by
// oneDNN's inner product (mkldnn::_linear_pointwise, the weight not
// prepacked). codegen/onednn_linear.py rewrites a CPU group's large float32
// linears into it and registers its fake kernel. The CPU kernel is here, not
// in Python: the generated code calls it through the dispatcher with the GIL
// released, and a Python kernel would take the GIL back on every call (behind
// a background compile's thread, up to Python's switch interval each time).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace {

at::Tensor onednnLinear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  // Boxed: the call is one per product, and the boxed form needs no C++
  // signature of an op whose schema torch may extend.
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(lazy_mlir, m) {
  m.def("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(lazy_mlir, CPU, m) {
  m.impl("onednn_linear", &onednnLinear);
}
