#include "memory/device_data_pool.h"

#include "runtime/run_stats.h"

#include <torch/csrc/lazy/ts_backend/ops/device_data.h>

#include <mutex>
#include <utility>
#include <vector>

namespace lazy_mlir {
namespace {

// A step's device data seldom number more; past it the slots wrap (a loop
// that never calls mark_step, reading values with .cpu(), still recycles,
// and each execution's scan stays short).
constexpr size_t kSlots = 4096;

std::mutex g_mutex;  // a step may be traced on another thread than the last one
bool g_on = true;
std::vector<torch::lazy::NodePtr> g_slots;
size_t g_next = 0;  // the slot the next request takes
// Released at a mark_step and no execution since: the next execution's
// release would find nothing to free (one scan of the slots per step).
bool g_released_at_boundary = false;

torch::lazy::DeviceData* asDeviceData(const torch::lazy::NodePtr& node) {
  return const_cast<torch::lazy::DeviceData*>(torch::lazy::DeviceData::Cast(node.get()));
}

}  // namespace

torch::lazy::NodePtr pooledDeviceData(const std::shared_ptr<torch::lazy::BackendData>& data,
                                      const torch::lazy::IrBuilder* ts) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_on) return ts->MakeDeviceData(data);
  const size_t slot = g_next++ % kSlots;
  if (slot < g_slots.size()) {
    torch::lazy::NodePtr& pooled = g_slots[slot];
    // use count 1: only this slot holds it. A node's hash is its shape's,
    // so the same shape (sizes and dtype) makes it the node a new one would be.
    if (pooled.use_count() == 1 && pooled->shape() == data->shape()) {
      asDeviceData(pooled)->SetData(data);
      RunStats::get().device_data_recycled++;
      return pooled;
    }
  }
  torch::lazy::NodePtr node = ts->MakeDeviceData(data);
  if (asDeviceData(node) == nullptr) return node;  // not TorchScript's device-data node: not pooled
  if (slot < g_slots.size()) {
    g_slots[slot] = node;
  } else {
    g_slots.push_back(node);
  }
  return node;
}

namespace {

void releaseFreeData() {  // with g_mutex held
  for (auto& node : g_slots) {
    if (node.use_count() == 1) asDeviceData(node)->SetData(nullptr);
  }
}

}  // namespace

void devicePoolStepBoundary() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_next = 0;
  releaseFreeData();
  g_released_at_boundary = true;
}

void releasePooledData() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!std::exchange(g_released_at_boundary, false)) releaseFreeData();
}

void setDeviceDataPool(bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_on = on;
  if (!on) {
    g_slots.clear();
    g_next = 0;
  }
}

}  // namespace lazy_mlir
