#include "ltc_fixes/pending_data.h"

#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/ts_backend/ops/device_data.h>

namespace lazy_mlir {

namespace {

bool isIdentityCopy(const torch::lazy::Node* node) {
  static const torch::lazy::OpKind detach = torch::lazy::OpKind::Get("aten::detach_copy");
  static const torch::lazy::OpKind alias = torch::lazy::OpKind::Get("aten::alias_copy");
  return (node->op() == detach || node->op() == alias) && node->operands().size() == 1;
}

}  // namespace

bool settlePendingData(const torch::lazy::LazyTensorPtr& tensor) {
  torch::lazy::Value value = tensor->CurrentIrValue();
  if (!value || tensor->CurrentDataHandle() != nullptr) {
    return false;  // nothing pending, or LTC's cached node of its own data (never synced)
  }
  const torch::lazy::Node* node = value.node.get();
  while (isIdentityCopy(node)) {
    node = node->operand(0).node;
  }
  const auto* data_node = torch::lazy::DeviceData::Cast(node);
  if (data_node == nullptr || !(data_node->data()->shape() == tensor->shape().Get())) {
    return false;
  }
  tensor->SetDataHandle(data_node->data());  // drops the pending value
  return true;
}

}  // namespace lazy_mlir
