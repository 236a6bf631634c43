#include "core/layer_regions.h"

#include "ltc_fixes/source_locations.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace lazy_mlir {

namespace {

std::mutex g_mutex;
std::vector<int64_t> g_boundaries;  // trace orders of the first node after each boundary, ascending

}  // namespace

void markLayerBoundary() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const int64_t next = nodesBuilt();
  if (g_boundaries.empty() || g_boundaries.back() != next) g_boundaries.push_back(next);
}

void clearLayerBoundaries() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_boundaries.clear();
}

int64_t layerRegion(const torch::lazy::Node* node) {
  const int64_t order = traceOrder(node);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (order < 0 || g_boundaries.empty()) return -1;
  return std::upper_bound(g_boundaries.begin(), g_boundaries.end(), order) - g_boundaries.begin();
}

}  // namespace lazy_mlir
