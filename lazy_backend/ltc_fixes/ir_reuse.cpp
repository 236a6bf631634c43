#include "ltc_fixes/ir_reuse.h"

#include "ltc_fixes/dead_draws.h"
#include "ltc_fixes/draw_stream.h"
#include "ltc_fixes/pending_data.h"
#include "memory/device_data_pool.h"
#include "optimizer/functional_update.h"
#include "core/layer_regions.h"

#include "runtime/run_stats.h"
#include "ltc_fixes/source_locations.h"

#include <torch/csrc/lazy/core/config.h>
#include <torch/csrc/lazy/core/internal_ops/ltc_ops.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/trie.h>
#include <torch/csrc/lazy/ts_backend/ops/device_data.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <memory>
#include <vector>

namespace lazy_mlir {
namespace {

// Successors kept per trie node: the path this step took and one other (a
// loop alternating two op sequences, e.g. a validation step every N steps).
constexpr size_t kKeptBranches = 2;

bool g_enabled = false;  // setIrReuse's choice (pauseIrReuse lowers the flag only)

// State of the tracing thread (LTC's trie is thread-local too).
int64_t g_device_data_ordinal = 0;  // device-data nodes handed out since the last step boundary
std::vector<std::weak_ptr<torch::lazy::Node>> g_data_nodes;  // the device-data nodes this builder made
int64_t g_trie_nodes_created = 0;  // trieNodesCreated() at the last walk
int64_t g_probes = 0;               // TrieNodes made by trieNodesCreated() itself

// A device-data node whose hash includes its ordinal in the step (3.).
class OrdinalDeviceData : public torch::lazy::DeviceData {
 public:
  OrdinalDeviceData(const std::shared_ptr<torch::lazy::BackendData>& data, int64_t ordinal)
      : DeviceData(data),
        ordinal_(ordinal),
        hash_(torch::lazy::HashCombine(DeviceData::hash(), torch::lazy::Hash(ordinal))),
        shape_hash_(torch::lazy::HashCombine(DeviceData::shapeHash(), torch::lazy::Hash(ordinal))) {}

  bool CanBeReused(const std::shared_ptr<torch::lazy::BackendData>& data, int64_t ordinal) const {
    return ordinal == ordinal_ && DeviceData::CanBeReused(data);
  }
  torch::lazy::hash_t hash() const override { return hash_; }
  torch::lazy::hash_t shapeHash() const override { return shape_hash_; }

 private:
  int64_t ordinal_;
  torch::lazy::hash_t hash_;
  torch::lazy::hash_t shape_hash_;
};

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
struct ReusingIrBuilder : torch::lazy::IrBuilder {
  explicit ReusingIrBuilder(const torch::lazy::IrBuilder* ts) : ts(ts) {}
  const torch::lazy::IrBuilder* ts;

  torch::lazy::NodePtr MakeDeviceData(const std::shared_ptr<torch::lazy::BackendData>& shared) const override {
    WithoutUserFrames data_names_no_line;  // (source_locations.h)
    const std::shared_ptr<torch::lazy::BackendData> data = ownScalarData(shared);
    if (!FLAGS_torch_lazy_reuse_ir) return pooledDeviceData(data, ts);
    const int64_t ordinal = g_device_data_ordinal++;
    torch::lazy::NodePtr node = torch::lazy::ReuseNode<OrdinalDeviceData>(data, ordinal);
    if (node == nullptr) {
      node = torch::lazy::MakeNode<OrdinalDeviceData>(data, ordinal);
      torch::lazy::CacheNode(node);
      g_data_nodes.push_back(node);
      return node;
    }
    // A reused node still holds the data of the step it last served.
    const_cast<OrdinalDeviceData*>(torch::lazy::NodeCast<OrdinalDeviceData>(node.get()))->SetData(data);
    return node;
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

// Trie nodes created so far on this thread (each takes the next id of a
// counter that only the trie's node constructor reads; this probe takes one).
int64_t trieNodesCreated() {
  torch::lazy::TrieNode probe;
  return static_cast<int64_t>(probe.unique_id) - g_probes++;
}

// Drops device-data IR values cached on tensors that hold their data (1.).
// False when a live tensor still holds an IR value without data after the
// step's sync: its graph may read trie nodes, and nothing is touched.
bool dropCachedDeviceData(const torch::lazy::BackendDevice& device) {
  auto live = torch::lazy::LazyGraphExecutor::Get()->GetLiveTensors(&device);
  for (const auto& tensor : live) {
    if (tensor->CurrentIrValue() && tensor->CurrentDataHandle() == nullptr) return false;
  }
  for (const auto& tensor : live) {
    if (tensor->CurrentIrValue()) {
      tensor->AssignIrValue(torch::lazy::Value());
      RunStats::get().cached_ir_dropped++;
    }
  }
  return true;
}

// Swaps the data of a device-data node for a placeholder of its shape when
// nothing else holds it (the node belongs to the trie alone after
// dropCachedDeviceData); a reuse puts new data in its place.
bool releaseData(const torch::lazy::DeviceData* node) {
  const auto& data = node->data();
  if (!data || data.use_count() != 1 || !data->HasValue()) return false;
  const_cast<torch::lazy::DeviceData*>(node)->SetData(
      std::make_shared<torch::lazy::TSData>(data->shape(), data->device()));
  RunStats::get().trie_buffers_released++;
  return true;
}

// After every step: the buffers of the step's inputs that only the trie's
// device-data nodes still hold (the tensors hold the step's outputs now).
void releaseTrieData() {
  size_t kept = 0;
  for (auto& weak : g_data_nodes) {
    torch::lazy::NodePtr node = weak.lock();
    if (node == nullptr) continue;  // pruned with its branch
    releaseData(torch::lazy::DeviceData::Cast(node.get()));
    g_data_nodes[kept++] = weak;
  }
  g_data_nodes.resize(kept);
}

// Prunes branches (4.) and releases buffers only the trie holds (2.).
// Iterative: the trie is a chain as long as a step.
void cleanTrie(torch::lazy::TrieNode* root) {
  std::vector<torch::lazy::TrieNode*> pending{root};
  while (!pending.empty()) {
    torch::lazy::TrieNode* node = pending.back();
    pending.pop_back();
    if (node->successors.size() > kKeptBranches) {
      RunStats::get().trie_branches_pruned += static_cast<int64_t>(node->successors.size() - kKeptBranches);
      node->successors.resize(kKeptBranches);  // the front ones are the most recently used
    }
    const auto* data_node = node->ir_node ? torch::lazy::DeviceData::Cast(node->ir_node.get()) : nullptr;
    if (data_node != nullptr) releaseData(data_node);
    for (auto& successor : node->successors) pending.push_back(successor.get());
  }
}

// A step boundary: no tensor keeps a device-data node cached (1.), the next
// device data count from 0 (3.) and the next trace starts at the trie's
// root. Not done (false) while a live tensor holds a pending computation:
// its graph may read nodes that the trie would then hand out again.
bool stepBoundary(const torch::lazy::BackendDevice& device) {
  if (!dropCachedDeviceData(device)) {
    RunStats::get().step_boundaries_skipped++;
    return false;
  }
  torch::lazy::TrieCache::Get()->ResetCurrent();
  g_device_data_ordinal = 0;
  return true;
}

// The backend's graph executor: LTC's, with IR reuse's clean-up after each
// mark_step, the live tensors' sync in functional_update's order with the
// step's dead draws (dead_draws.h), and no graph for a tensor whose pending
// value is device data (pending_data.h), at mark_step as at a read.
class BackendGraphExecutor : public torch::lazy::LazyGraphExecutor {
 public:
  void SyncLiveTensorsGraph(const torch::lazy::BackendDevice* device, c10::ArrayRef<std::string> devices,
                            bool wait) override {
    auto tensors = GetLiveTensors(device);  // as LTC's own, but for the order
    orderUpdatedLast(tensors);
    addDeadDraws(&tensors, device ? *device : torch::lazy::BackendDevice());
    SyncTensorsGraph(&tensors, devices, wait, /*sync_ltc_data=*/true);
    drawsSettled();
  }

  void MarkStep(const torch::lazy::BackendDevice& device) override {
    torch::lazy::LazyGraphExecutor::MarkStep(device);  // also resets the trie's cursor
    newDrawStream();
    g_device_data_ordinal = 0;
    clearLayerBoundaries();
    devicePoolStepBoundary();
    if (!FLAGS_torch_lazy_reuse_ir || !stepBoundary(device)) return;
    // Walk the trie only after a step that added to it (a fork): otherwise
    // there is nothing to prune, and the device-data nodes are on a list.
    const int64_t inserted = trieNodesCreated() - g_trie_nodes_created;
    g_trie_nodes_created += inserted;
    if (inserted == 0) {
      releaseTrieData();
      return;
    }
    cleanTrie(torch::lazy::TrieCache::Get()->Current());
  }

 private:
  // Asked of each tensor a sync collects (pending, no data handle): one
  // settled here is read from its data like any synced tensor.
  bool ShouldSyncTensor(const torch::lazy::LazyTensorPtr& tensor) const override {
    if (settlePendingData(tensor)) return false;
    return tensor->CurrentIrValue()->op() != *torch::lazy::ltc_not_supported;  // LTC's own rule
  }
};

}  // namespace

void setIrReuse(bool on) {
  static BackendGraphExecutor* executor = [] {
    auto* created = new BackendGraphExecutor();
    torch::lazy::LazyGraphExecutor::Register(created);
    return created;
  }();
  (void)executor;
  g_enabled = on;
  FLAGS_torch_lazy_reuse_ir = on;
  if (!on) torch::lazy::TrieCache::Get()->Clear();
}

const torch::lazy::IrBuilder* irReuseBuilder(const torch::lazy::IrBuilder* ts) {
  static const ReusingIrBuilder builder(ts);  // TorchScript's builder is one for the process
  return &builder;
}

void pauseIrReuse(bool paused) { FLAGS_torch_lazy_reuse_ir = g_enabled && !paused; }

bool irReuseStepBoundary() { return FLAGS_torch_lazy_reuse_ir && stepBoundary(torch::lazy::BackendDevice()); }

}  // namespace lazy_mlir
