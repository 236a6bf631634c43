#include "optimizer/functional_update.h"

#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/lazy/core/tensor_impl.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "nodes/builtin_op_node.h"

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

namespace {

// After `target`'s value changed, what functionalization's in-place kernels
// do next: the update reaches the tensors aliasing it (storage generation)
// and its autograd version counter is bumped.
void finishUpdate(const at::Tensor& target) {
  fimpl::commit_update(target);
  fimpl::sync(target);
  torch::autograd::impl::bump_version(target);
}

void checkFunctional(const at::Tensor& target) {
  TORCH_CHECK(fimpl::isFunctionalTensor(target), "lazy_mlir: an in-place update of a tensor that is not "
              "functionalized (not a lazy tensor?)");
}

// The lazy tensors that took a traced update since the last sync of the live
// tensors, in update order (orderUpdatedLast).
std::mutex g_updated_mutex;
std::vector<std::weak_ptr<torch::lazy::LazyTensor::Data>> g_updated;
constexpr size_t kPrunedAbove = 1 << 16;

// The lazy tensor under `target` when nothing but `target` holds it (not
// Python, not another wrapper: _Replay's written outputs share theirs), so
// that a new IR value in it changes no other tensor; else null.
torch::lazy::LazyTensor* soleLazyValue(const at::Tensor& target) {
  auto* wrapper = fimpl::unsafeGetFunctionalWrapper(target);
  const at::Tensor& value = wrapper->value();
  // a tensor that is not a view is also its storage's base (after a sync)
  auto* storage = static_cast<at::functionalization::FunctionalStorageImpl*>(wrapper->storage().unsafeGetStorageImpl());
  const bool is_base = storage->base().unsafeGetTensorImpl() == value.unsafeGetTensorImpl();
  if (value.use_count() != (is_base ? 2u : 1u)) return nullptr;
  auto* impl = dynamic_cast<torch::lazy::LTCTensorImpl*>(value.unsafeGetTensorImpl());
  if (impl == nullptr) return nullptr;
  torch::lazy::LazyTensorPtr lazy = impl->tensor();  // a copy: the impl's own is the other count
  // copies of a LazyTensor (shallow_copy_and_detach) share its Data
  if (lazy.use_count() != 2 || lazy->data().use_count() != 1) return nullptr;
  return lazy.get();
}

// A target's sizes from its lazy tensor: the wrapper's sizes() would first
// recompute the inner tensor's sizes and strides, stale after every update.
std::vector<int64_t> currentSizes(const at::Tensor& target) {
  const at::Tensor& value = fimpl::unsafeGetFunctionalWrapper(target)->value();
  if (auto lazy = torch::lazy::TryGetLtcTensor(value)) return lazy->shape().Get().sizes().vec();
  return target.sizes().vec();
}

}  // namespace

void functionalReplace(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& values) {
  TORCH_CHECK(targets.size() == values.size(), "lazy_mlir: ", targets.size(), " tensors to update, ", values.size(),
              " values");
  for (size_t i = 0; i < targets.size(); ++i) {
    const at::Tensor& target = targets[i];
    checkFunctional(target);
    TORCH_CHECK(target.sizes() == values[i].sizes() && target.scalar_type() == values[i].scalar_type(),
                "lazy_mlir: in-place update of a ", target.sizes(), " ", target.scalar_type(), " tensor with a ",
                values[i].sizes(), " ", values[i].scalar_type(), " value");
    fimpl::replace_(target, values[i]);
    finishUpdate(target);
  }
}

void writeLazy(const at::Tensor& target, const at::Tensor& value) {
  auto lazy_target = torch::lazy::TryGetLtcTensor(target);
  auto lazy_value = torch::lazy::TryGetLtcTensor(value);
  TORCH_CHECK(lazy_target && lazy_value, "lazy_mlir: writeLazy takes lazy tensors, not ", target.device(), " and ",
              value.device());
  TORCH_CHECK(target.sizes() == value.sizes(), "lazy_mlir: writing a ", value.sizes(), " value into a ",
              target.sizes(), " tensor");
  lazy_target->SetInPlaceIrValue(lazy_value->GetIrValue());
}

void traceUpdate(const std::string& qualified_name, const std::string& overload, const pybind11::list& args,
                 const std::vector<at::Tensor>& targets, const std::vector<int64_t>& list_sizes) {
  std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> outputs;
  outputs.reserve(targets.size());
  for (const at::Tensor& t : targets) {
    checkFunctional(t);
    outputs.emplace_back(t.scalar_type(), currentSizes(t));
  }
  auto [node, device] = traceBuiltinNode(qualified_name, overload, args, outputs, list_sizes);
  std::vector<std::weak_ptr<torch::lazy::LazyTensor::Data>> updated;
  updated.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const at::Tensor& target = targets[i];
    torch::lazy::Value result(node, i);
    // The lazy tensor under the target takes the result as its IR value, as
    // LTC's in-place ops did before functionalization: no lazy tensor and
    // TensorImpl made and freed per result (~1.2 us each; an AdamW step
    // writes 3 per parameter).
    if (auto* sole = soleLazyValue(target)) {
      sole->SetIrValue(std::move(result));
      auto* wrapper = fimpl::unsafeGetFunctionalWrapper(target);
      wrapper->mark_mutation();  // what replace_ records (for AOTAutograd's analysis)
      if (!at::GradMode::is_enabled() || c10::InferenceMode::is_enabled()) {
        wrapper->mark_mutation_during_no_grad_or_inference_mode();
      }
    } else {
      fimpl::replace_(target, torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(result, device)));
    }
    finishUpdate(target);
    // what the target holds now (a view's value is regenerated by the sync)
    if (auto lazy = torch::lazy::TryGetLtcTensor(fimpl::from_functional_tensor(target))) {
      updated.push_back(lazy->data());
    }
  }
  std::lock_guard<std::mutex> lock(g_updated_mutex);
  // A loop that never syncs its live tensors (no mark_step) would grow the
  // list: the tensors of updates that are gone are dropped now and then.
  if (g_updated.size() > kPrunedAbove) {
    g_updated.erase(std::remove_if(g_updated.begin(), g_updated.end(), [](const auto& d) { return d.expired(); }),
                    g_updated.end());
  }
  g_updated.insert(g_updated.end(), updated.begin(), updated.end());
}

void orderUpdatedLast(std::vector<torch::lazy::LazyTensorPtr>& tensors) {
  std::unordered_map<const torch::lazy::LazyTensor::Data*, size_t> rank;
  {
    std::lock_guard<std::mutex> lock(g_updated_mutex);
    if (g_updated.empty()) return;
    for (size_t i = 0; i < g_updated.size(); ++i) {
      if (auto data = g_updated[i].lock()) rank[data.get()] = i;  // a tensor updated twice: its last update
    }
    g_updated.clear();
  }
  auto updated = std::stable_partition(tensors.begin(), tensors.end(), [&](const torch::lazy::LazyTensorPtr& t) {
    return rank.count(t->data().get()) == 0;
  });
  std::sort(updated, tensors.end(), [&](const torch::lazy::LazyTensorPtr& a, const torch::lazy::LazyTensorPtr& b) {
    return rank.at(a->data().get()) < rank.at(b->data().get());
  });
}

}  // namespace lazy_mlir
