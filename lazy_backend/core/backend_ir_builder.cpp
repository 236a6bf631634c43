#include "core/backend_ir_builder.h"

#include "ltc_fixes/source_locations.h"
#include "memory/device_data_pool.h"

#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <memory>
#include <vector>

namespace lazy_mlir {
namespace {

// LTC hands out one data object per scalar value (its data cache), and a
// graph takes data it reads twice as one input: two scalars equal at one
// sequence length and apart at another gave the group another input list,
// so another shape-generic family (T5). A read-only scalar's node gets data
// of its own, an alias of the cached tensor: one input per node, no input
// the same tensor as another, whatever the values; the storage and its
// version are still the ones ScalarGuards and the native entry know.
std::shared_ptr<torch::lazy::BackendData> ownScalarData(const std::shared_ptr<torch::lazy::BackendData>& data) {
  using Info = torch::lazy::LazyGraphExecutor::DeviceDataInfo;
  const auto* info = dynamic_cast<const Info*>(data->info());
  auto* ts = dynamic_cast<torch::lazy::TSData*>(data.get());
  if (info == nullptr || !info->read_only || ts == nullptr || !ts->HasValue()) return data;
  auto own = std::make_shared<torch::lazy::TSData>(ts->data().alias(), data->shape(), data->device());
  own->SetInfo(std::make_shared<Info>(info->tensor_id, /*read_only=*/true));
  return own;
}

// TorchScript's builder (delegated to: its node types are not exported to
// subclass it) with MakeDeviceData replaced.
struct BackendIrBuilder : torch::lazy::IrBuilder {
  explicit BackendIrBuilder(const torch::lazy::IrBuilder* ts) : ts(ts) {}
  const torch::lazy::IrBuilder* ts;

  torch::lazy::NodePtr MakeDeviceData(const std::shared_ptr<torch::lazy::BackendData>& data) const override {
    WithoutUserFrames data_names_no_line;  // (source_locations.h)
    return pooledDeviceData(ownScalarData(data), ts);
  }
  torch::lazy::NodePtr MakeScalar(const at::Scalar& value, const at::ScalarType& type) const override {
    return ts->MakeScalar(value, type);
  }
  torch::lazy::NodePtr MakeExpand(const torch::lazy::Value& input0, const std::vector<int64_t>& size,
                                  const bool& is_scalar_expand) const override {
    return ts->MakeExpand(input0, size, is_scalar_expand);
  }
  torch::lazy::NodePtr MakeCast(const torch::lazy::Value& input0, const at::ScalarType& dtype,
                                const std::optional<at::ScalarType>& stype) const override {
    return ts->MakeCast(input0, dtype, stype);
  }
  torch::lazy::NodePtr MakeTensorList(const torch::lazy::OpList& inputs) const override {
    return ts->MakeTensorList(inputs);
  }
  torch::lazy::NodePtr MakeGeneric(const torch::lazy::OpKind& op, const torch::lazy::OpList& operands,
                                   const torch::lazy::Shape& shape, const size_t& num_outputs,
                                   const torch::lazy::hash_t& hash_seed) const override {
    return ts->MakeGeneric(op, operands, shape, num_outputs, hash_seed);
  }
  torch::lazy::NodePtr MakeSizeNode(const torch::lazy::Value& input, size_t dim) const override {
    return ts->MakeSizeNode(input, dim);
  }
  torch::lazy::NodePtr MakeSizeAdd(const torch::lazy::Value& a, const torch::lazy::Value& b) const override {
    return ts->MakeSizeAdd(a, b);
  }
  torch::lazy::NodePtr MakeSizeMul(const torch::lazy::Value& a, const torch::lazy::Value& b) const override {
    return ts->MakeSizeMul(a, b);
  }
  torch::lazy::NodePtr MakeSizeDiv(const torch::lazy::Value& a, const torch::lazy::Value& b) const override {
    return ts->MakeSizeDiv(a, b);
  }
};

}  // namespace

const torch::lazy::IrBuilder* backendIrBuilder(const torch::lazy::IrBuilder* ts) {
  static const BackendIrBuilder builder(ts);  // TorchScript's builder is one for the process
  return &builder;
}

}  // namespace lazy_mlir
