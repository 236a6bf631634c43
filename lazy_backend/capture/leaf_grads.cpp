#include "capture/leaf_grads.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

namespace lazy_mlir {

namespace {

// AccumulateGrad's "steal" case: it would store `grad` (detached) as is.
bool storedAsIs(const at::Tensor& leaf, const at::Tensor& grad) {
  if (!leaf.requires_grad() || !leaf.is_leaf() || leaf.grad().defined()) return false;  // else it accumulates
  if (grad.requires_grad() || grad.sizes() != leaf.sizes() || grad.scalar_type() != leaf.scalar_type() ||
      grad.device() != leaf.device() || grad.layout() != at::kStrided || leaf.layout() != at::kStrided) {
    return false;  // it would check, convert or copy
  }
  const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(leaf);  // shared_ptr in torch 2.11
  return accumulator && accumulator->pre_hooks().empty() && accumulator->tensor_pre_hooks().empty() &&
         accumulator->retains_grad_hooks().empty() && accumulator->post_hooks().empty() &&
         !accumulator->tensor_post_acc_grad_hooks();
}

}  // namespace

std::vector<std::optional<at::Tensor>> storeLeafGrads(const std::vector<std::optional<at::Tensor>>& leaves,
                                                      std::vector<std::optional<at::Tensor>> grads) {
  TORCH_CHECK(leaves.size() == grads.size(), "lazy_mlir: ", leaves.size(), " leaves, ", grads.size(), " gradients");
  // Empty for a plain backward(); autograd.grad() and backward(inputs=...)
  // choose what runs (and grad() must not touch .grad).
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || !exec_info->empty()) return grads;
  std::unordered_set<const c10::TensorImpl*> stored;  // one tensor is one parameter's gradient only
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!leaves[i] || !leaves[i]->defined() || !grads[i] || !grads[i]->defined()) continue;
    if (!storedAsIs(*leaves[i], *grads[i]) || !stored.insert(grads[i]->unsafeGetTensorImpl()).second) continue;
    at::Tensor leaf = *leaves[i];
    leaf.mutable_grad() = *std::move(grads[i]);
    grads[i] = std::nullopt;
  }
  return grads;
}

}  // namespace lazy_mlir
