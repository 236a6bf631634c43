// ParameterBinding: which graph parameter each device-data use reads.
//
// LTC looks a computation up by a hash of the sync roots' trees plus the
// "parameter sequence": the parameter index of each device-data node in the
// order the post-order first meets it (lazy_graph_executor.cpp, RunPostOrder
// and SyncTensorsGraphInternal). A device-data node hashes by shape alone, so
// that key does not say which parameter each use of a shared device-data node
// reads. Two graphs that differ only there collide, and the cached
// computation runs with the other graph's binding, silently:
//   roots [x, y, sub(x, y)]  and  roots [x, y, sub(y, x)]
// (x, y fresh `.to("lazy")` tensors, alive at the sync, are roots themselves)
// both meet x first, hash alike, and the second computes x - y.
//
// During each sync LTC asks the backend for every post-order node's data
// (GetComputationDataFromNode), so the backend sees the graph's post-order.
// SyncRecord keeps it for the sync in progress, with a 64-bit hash of every
// device-data use: (consumer's post-order position, operand slot, parameter
// index). A computation remembers the hash it was compiled for
// (GraphBinding); LazyMlirBackend::ExecuteComputation compares, and on a
// mismatch lowers the current graph (its nodes are alive then: LTC executes
// inside the sync, its IO thread pool being off) and keeps
// the result as the computation's variant for that binding.
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/backend/backend_data.h>
#include <torch/csrc/lazy/core/ir.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lazy_mlir {

// What a compiled computation was lowered for: its device-data use hash, and
// where its outputs sit in the post-order, to lower another graph of the
// same shape with the same outputs.
struct GraphBinding {
  bool known = false;        // false: made outside a recorded sync; never checked
  uint64_t uses_hash = 0;    // SyncRecord::usesHash() of the graph
  size_t post_order_size = 0;
  std::vector<std::pair<uint32_t, uint32_t>> outputs;  // (post-order position, output index)
  std::vector<torch::lazy::hash_t> output_hashes;      // node hash at each of those positions
};

// A map from 64-bit keys (node addresses, data handles) to indices: open
// addressing, cleared per sync, a few nanoseconds a lookup (onNode runs for
// every node of every sync).
class IndexTable {
 public:
  void clear();
  // The index stored for `key`, after storing `index` for it if it had none;
  // `added` tells which.
  uint32_t emplace(uint64_t key, uint32_t index, bool* added);
  const uint32_t* find(uint64_t key) const {
    if (size_ == 0) return nullptr;
    const size_t mask = keys_.size() - 1;
    for (size_t i = slot(key);; i = (i + 1) & mask) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_); }
  void grow();

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t size_ = 0;
  int shift_ = 64;
};

// The sync in progress on this thread (LTC syncs and, without its thread
// pool, executes on the thread that traced).
class SyncRecord {
 public:
  static SyncRecord& current();  // thread-local

  // LTC makes one output placeholder per root just before its post-order
  // walk: the first one after a walk starts a new record.
  void onPlaceholder() {
    if (!nodes_.empty()) clear();
  }
  // One post-order node and the data LTC got for it (null unless device data).
  void onNode(const torch::lazy::Node* node, const torch::lazy::BackendDataPtr& data);
  // The sync's one execution ran: the nodes may go now, the record describes
  // no later execution (e.g. torch._lazy's run of a cached graph by hash).
  void onExecuted() { executed_ = true; }

  uint64_t usesHash() const { return uses_hash_; }
  const std::vector<const torch::lazy::Node*>& postOrder() const { return nodes_; }
  size_t numParameters() const { return params_.size(); }
  // How many of the post-order's device-data nodes read parameter `index`.
  uint32_t nodesOf(size_t index) const { return index < param_nodes_.size() ? param_nodes_[index] : 0; }
  // Whether `arguments` are this record's parameters (same objects, same
  // order) and the sync has not executed yet.
  bool describes(c10::ArrayRef<torch::lazy::BackendDataPtr> arguments) const;

 private:
  void clear();

  std::vector<const torch::lazy::Node*> nodes_;
  std::vector<const torch::lazy::BackendData*> params_;
  std::vector<uint32_t> param_nodes_;  // per parameter: device-data nodes reading it
  IndexTable param_of_handle_;
  IndexTable param_of_node_;
  uint64_t uses_hash_ = 0x6a09e667f3bcc908ULL;
  bool executed_ = false;
};

// The TorchScript value each post-order node output was lowered to, from the
// latest lowering on this thread (LazyMlirBackend::CreateLoweringContext).
class LoweredOutputs {
 public:
  static LoweredOutputs& current();  // thread-local
  void reset(const torch::jit::Graph* graph, size_t post_order_size) {
    graph_ = graph;
    post_order_size_ = post_order_size;
    where_.clear();
  }
  void add(torch::jit::Value* value, const torch::lazy::Node* node, uint32_t position, uint32_t index) {
    where_.emplace(value, Where{node, position, index});
  }
  // The binding of `graph` (the lowering's graph, outputs registered) for the
  // record's sync, or an unknown binding if they do not belong together.
  GraphBinding bindingOf(const torch::jit::Graph& graph, const SyncRecord& record, int parameters) const;

 private:
  const torch::jit::Graph* graph_ = nullptr;
  size_t post_order_size_ = 0;
  struct Where {
    const torch::lazy::Node* node;
    uint32_t position;
    uint32_t index;
  };
  std::unordered_map<const torch::jit::Value*, Where> where_;
};

}  // namespace lazy_mlir
