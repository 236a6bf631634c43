#include "ltc_fixes/parameter_binding.h"

#include <algorithm>

namespace lazy_mlir {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void IndexTable::clear() {
  if (size_ == 0) return;
  std::fill(keys_.begin(), keys_.end(), kEmpty);
  size_ = 0;
}

void IndexTable::grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<uint32_t> values = std::move(values_);
  const size_t capacity = keys.empty() ? 64 : keys.size() * 2;
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, 0);
  shift_ = 64 - __builtin_ctzll(capacity);
  size_ = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    bool added = false;
    if (keys[i] != kEmpty) emplace(keys[i], values[i], &added);
  }
}

uint32_t IndexTable::emplace(uint64_t key, uint32_t index, bool* added) {
  if ((size_ + 1) * 2 > keys_.size()) grow();
  const size_t mask = keys_.size() - 1;
  for (size_t i = slot(key);; i = (i + 1) & mask) {
    if (keys_[i] == key) {
      *added = false;
      return values_[i];
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = index;
      ++size_;
      *added = true;
      return index;
    }
  }
}

SyncRecord& SyncRecord::current() {
  thread_local SyncRecord record;
  return record;
}

void SyncRecord::clear() {
  nodes_.clear();
  params_.clear();
  param_nodes_.clear();
  param_of_handle_.clear();
  param_of_node_.clear();
  uses_hash_ = 0x6a09e667f3bcc908ULL;
  executed_ = false;
}

void SyncRecord::onNode(const torch::lazy::Node* node, const torch::lazy::BackendDataPtr& data) {
  const auto position = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(node);
  if (data) {  // a parameter: numbered like LTC's RunPostOrder, by first handle
    bool added = false;
    const uint32_t index = param_of_handle_.emplace(static_cast<uint64_t>(data->GetHandle()),
                                                    static_cast<uint32_t>(params_.size()), &added);
    if (added) {
      params_.push_back(data.get());
      param_nodes_.push_back(0);
    }
    ++param_nodes_[index];
    param_of_node_.emplace(reinterpret_cast<uint64_t>(node), index, &added);
    return;
  }
  const auto& operands = node->operands();
  for (size_t slot = 0; slot < operands.size(); ++slot) {
    // Device-data operands are the nodes numbered above (looked up by
    // address: no load of the operand node).
    const uint32_t* index = param_of_node_.find(reinterpret_cast<uint64_t>(operands[slot].node));
    if (index == nullptr) continue;
    const uint64_t use = (static_cast<uint64_t>(position) << 32) ^ (static_cast<uint64_t>(slot) << 24) ^ *index;
    uses_hash_ = mix(uses_hash_ ^ use);
  }
}

bool SyncRecord::describes(c10::ArrayRef<torch::lazy::BackendDataPtr> arguments) const {
  if (executed_ || nodes_.empty() || arguments.size() != params_.size()) return false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (arguments[i].get() != params_[i]) return false;
  }
  return true;
}

LoweredOutputs& LoweredOutputs::current() {
  thread_local LoweredOutputs outputs;
  return outputs;
}

GraphBinding LoweredOutputs::bindingOf(const torch::jit::Graph& graph, const SyncRecord& record,
                                       int parameters) const {
  GraphBinding binding;
  if (graph_ != &graph || record.postOrder().size() != post_order_size_ || record.postOrder().empty() ||
      record.numParameters() != static_cast<size_t>(parameters)) {
    return binding;
  }
  const auto& post_order = record.postOrder();
  for (const torch::jit::Value* output : graph.outputs()) {
    const auto it = where_.find(output);
    if (it == where_.end()) return GraphBinding{};
    const Where& where = it->second;
    if (where.position >= post_order.size() || post_order[where.position] != where.node) {
      return GraphBinding{};  // lowered from another post-order than the sync's
    }
    binding.outputs.emplace_back(where.position, where.index);
    binding.output_hashes.push_back(where.node->hash());
  }
  binding.known = true;
  binding.uses_hash = record.usesHash();
  binding.post_order_size = post_order.size();
  return binding;
}

}  // namespace lazy_mlir
