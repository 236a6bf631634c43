#include "ltc_fixes/parameter_settling.h"

#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

namespace lazy_mlir {

namespace {

at::FunctionalTensorWrapper* wrapperOf(const at::Tensor& t) {
  return at::functionalization::impl::isFunctionalTensor(t) ? at::functionalization::impl::unsafeGetFunctionalWrapper(t)
                                                            : nullptr;
}

const at::Tensor& baseOf(at::FunctionalTensorWrapper* wrapper) {
  return static_cast<at::functionalization::FunctionalStorageImpl*>(wrapper->storage().unsafeGetStorageImpl())->base();
}

}  // namespace

std::vector<at::Tensor> functionalBases(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> bases;
  for (const at::Tensor& t : tensors) {
    if (auto* wrapper = wrapperOf(t)) {
      wrapper->apply_updates();
      bases.push_back(baseOf(wrapper));
    }
  }
  return bases;
}

int64_t shareBaseBuffers(const std::vector<at::Tensor>& tensors) {
  int64_t shared = 0;
  for (const at::Tensor& t : tensors) {
    auto* wrapper = wrapperOf(t);
    if (wrapper == nullptr) {
      continue;
    }
    torch::lazy::LazyTensorPtr value = torch::lazy::TryGetLtcTensor(wrapper->value());
    torch::lazy::LazyTensorPtr base = torch::lazy::TryGetLtcTensor(baseOf(wrapper));
    if (!value || !base || value == base) {
      continue;
    }
    auto* base_data = dynamic_cast<torch::lazy::TSData*>(base->CurrentDataHandle().get());
    torch::lazy::BackendDataPtr value_data = value->CurrentDataHandle();
    if (base_data == nullptr || !base_data->HasValue() || !value_data || !(value_data->shape() == base_data->shape())) {
      continue;
    }
    value->SetDataHandle(
        std::make_shared<torch::lazy::TSData>(base_data->data(), base_data->shape(), base_data->device()));
    ++shared;
  }
  return shared;
}

int64_t ownBuffers(const std::vector<at::Tensor>& tensors) {
  int64_t owned = 0;
  for (const at::Tensor& t : tensors) {
    auto* wrapper = wrapperOf(t);
    // another alias of the storage (a `.data` the user holds, a parameter
    // tied by storage) must keep seeing this tensor's updates
    if (wrapper == nullptr || wrapper->isBaseTensor() || wrapper->storage().use_count() != 1) {
      continue;
    }
    wrapper->sync_();
    wrapper->_unsafe_reset_storage();
    // A fresh storage is at generation 0, where views taken of it read their
    // value as taken; after a step's update (generation > 0) they read it
    // regenerated from the base. One update of the same value makes the
    // first step trace as every later one.
    wrapper->replace_(wrapper->value());
    wrapper->commit_update();
    wrapper->sync_();
    ++owned;
  }
  return owned;
}

}  // namespace lazy_mlir
