#include "ltc_fixes/draw_order.h"

#include <torch/csrc/lazy/ts_backend/ops/device_data.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "ltc_fixes/source_locations.h"

namespace lazy_mlir {

namespace {

using torch::lazy::Node;

std::mutex g_mutex;
std::unordered_set<c10::Symbol>& randomOps() {
  static auto* ops = new std::unordered_set<c10::Symbol>();
  return *ops;
}

enum class Mark { kVisiting, kDone };

}  // namespace

void setRandomOps(const std::vector<std::string>& kinds) {
  std::lock_guard<std::mutex> lock(g_mutex);
  randomOps().clear();
  for (const auto& kind : kinds) randomOps().insert(c10::Symbol::fromQualString(kind));
}

bool isRandomOp(c10::Symbol kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return randomOps().count(kind) > 0;
}

std::vector<const Node*> inDrawOrder(c10::ArrayRef<const Node*> post_order) {
  std::vector<const Node*> draws;
  for (const Node* node : post_order) {
    if (isRandomOp(node->op().op)) draws.push_back(node);
  }
  auto traced_before = [](const Node* a, const Node* b) { return traceOrder(a) < traceOrder(b); };
  if (std::is_sorted(draws.begin(), draws.end(), traced_before)) return {};
  if (std::any_of(draws.begin(), draws.end(), [](const Node* n) { return traceOrder(n) < 0; })) return {};

  std::sort(draws.begin(), draws.end(), traced_before);
  std::unordered_map<const Node*, const Node*> previous_draw;
  for (size_t i = 1; i < draws.size(); ++i) previous_draw[draws[i]] = draws[i - 1];
  const std::unordered_set<const Node*> in_graph(post_order.begin(), post_order.end());

  std::vector<const Node*> order;
  order.reserve(post_order.size());
  std::unordered_map<const Node*, Mark> mark;
  // Device data first. Not through the backend's GetComputationDataFromNode:
  // ours records each call as the sync's next post-order node
  // (parameter_binding.h), and a second walk would count every parameter's
  // uses twice (buffer donation then took a live input for a dead one).
  for (const Node* node : post_order) {
    if (torch::lazy::DeviceData::Cast(node) != nullptr) {
      order.push_back(node);
      mark[node] = Mark::kDone;
    }
  }
  // Depth-first from each node in LTC's order: operands first, and for a
  // random op the draw traced before it. Iterative: chains run thousands deep.
  std::vector<const Node*> stack;
  for (const Node* root : post_order) {
    stack.push_back(root);
    while (!stack.empty()) {
      const Node* node = stack.back();
      auto it = mark.find(node);
      if (it != mark.end() && it->second == Mark::kDone) {
        stack.pop_back();
        continue;
      }
      if (it == mark.end()) {
        mark[node] = Mark::kVisiting;
        auto need = [&](const Node* before) {
          if (before == nullptr || !in_graph.count(before)) return true;
          auto m = mark.find(before);
          if (m == mark.end()) {
            stack.push_back(before);
            return true;
          }
          return m->second == Mark::kDone;  // visiting: a cycle, the trace order contradicts the data flow
        };
        auto prev = previous_draw.find(node);
        if (prev != previous_draw.end() && !need(prev->second)) return {};
        for (const auto& operand : node->operands()) {
          if (!need(operand.node)) return {};
        }
        continue;
      }
      mark[node] = Mark::kDone;
      order.push_back(node);
      stack.pop_back();
    }
  }
  TORCH_INTERNAL_ASSERT(order.size() == post_order.size(), "lazy_mlir: draw order lost nodes");
  return order;
}

}  // namespace lazy_mlir
