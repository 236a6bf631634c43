#include "functional_update.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/autograd/variable.h>

#include "builtin_op_node.h"

namespace lazy_mlir {

namespace fimpl = at::functionalization::impl;

std::vector<at::Tensor> functionalValues(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> values;
  values.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    if (fimpl::isFunctionalTensor(t)) {
      fimpl::sync(t);
      values.push_back(fimpl::from_functional_tensor(t));
    } else {
      values.push_back(t);
    }
  }
  return values;
}

void functionalReplace(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& values) {
  TORCH_CHECK(targets.size() == values.size(), "lazy_mlir: ", targets.size(), " tensors to update, ", values.size(),
              " values");
  for (size_t i = 0; i < targets.size(); ++i) {
    const at::Tensor& target = targets[i];
    TORCH_CHECK(fimpl::isFunctionalTensor(target), "lazy_mlir: an in-place update of a tensor that is not "
                "functionalized (not a lazy tensor?)");
    TORCH_CHECK(target.sizes() == values[i].sizes() && target.scalar_type() == values[i].scalar_type(),
                "lazy_mlir: in-place update of a ", target.sizes(), " ", target.scalar_type(), " tensor with a ",
                values[i].sizes(), " ", values[i].scalar_type(), " value");
    fimpl::replace_(target, values[i]);
    fimpl::commit_update(target);
    fimpl::sync(target);
    torch::autograd::impl::bump_version(target);
  }
}

void traceUpdate(const std::string& qualified_name, const std::string& overload, const pybind11::list& args,
                 const std::vector<at::Tensor>& targets, const std::vector<int64_t>& list_sizes) {
  std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> outputs;
  outputs.reserve(targets.size());
  for (const at::Tensor& t : targets) outputs.emplace_back(t.scalar_type(), t.sizes().vec());
  functionalReplace(targets, traceBuiltin(qualified_name, overload, args, outputs, list_sizes));
}

}  // namespace lazy_mlir
