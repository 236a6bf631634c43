#include "kernels/meta_kernels.h"

#include <ATen/ops/empty_like_native.h>

#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace lazy_mlir {

namespace {

void inplacePointwiseMeta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, num_args);
  const at::Tensor self = args[0].toTensor();
  for (size_t i = 1; i < num_args; ++i) {
    const c10::IValue& arg = args[i];
    at::ScalarType result = self.scalar_type();
    if (arg.isTensor()) {
      const at::Tensor& other = arg.toTensor();
      const auto broadcast = at::infer_size(self.sizes(), other.sizes());
      TORCH_CHECK(c10::IntArrayRef(broadcast) == self.sizes(), op.schema().name(), ": output with shape ",
                  self.sizes(), " doesn't match the broadcast shape ", c10::IntArrayRef(broadcast));
      result = at::result_type(self, other);
    } else if (arg.isScalar()) {
      result = at::result_type(self, arg.toScalar());
    }
    TORCH_CHECK(c10::canCast(result, self.scalar_type()), op.schema().name(), ": result type ", result,
                " can't be cast to the desired output type ", self.scalar_type());
  }
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, self);
}

}  // namespace

void registerMetaKernels(const std::vector<std::string>& inplace_ops) {
  // Libraries must outlive their registrations: kept for the process.
  static auto* libraries = new std::vector<std::unique_ptr<torch::Library>>();
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                                  __FILE__, __LINE__);
  for (const auto& name : inplace_ops) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&inplacePointwiseMeta>());
  }
  library->impl("empty_like", TORCH_FN(at::native::empty_like));
  libraries->push_back(std::move(library));
}

}  // namespace lazy_mlir
