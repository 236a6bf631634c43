#include "ltc_fixes/value_reads.h"

#include <torch/csrc/lazy/core/ir_util.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ops/device_data.h>
#include <torch/library.h>

#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/draw_stream.h"
#include "nodes/region_node.h"

namespace lazy_mlir {

namespace {

thread_local bool t_syncing_live = false;

struct SyncingLive {  // sets t_syncing_live for its scope
  SyncingLive() { t_syncing_live = true; }
  ~SyncingLive() { t_syncing_live = false; }
};

bool pendingOnDraws(const torch::lazy::LazyTensorPtr& lazy) {
  return !lazy->CurrentDataHandle() && !lazy->CurrentTensorData() && dependsOnDraws(lazy->GetIrValue().node.get());
}

void syncLive(const torch::lazy::BackendDevice& device) {
  const SyncingLive syncing;
  keepDrawsThroughSync(device);  // a checkpoint's recompute after the read replays them
  torch::lazy::LazyGraphExecutor::Get()->SyncLiveTensorsGraph(&device, /*devices=*/{}, /*wait=*/true);
}

at::Scalar localScalarDense(const at::Tensor& self) {
  auto lazy = torch::lazy::TryGetLtcTensor(self);
  TORCH_CHECK(lazy, "lazy_mlir: _local_scalar_dense on a tensor that is not lazy (", self.device(), ")");
  if (pendingOnDraws(lazy)) syncLive(lazy->GetDevice());
  // what LTC's eager fallback does: the value on the host, read there
  return lazy->ToTensor(/*detached=*/true).item();
}

}  // namespace

bool dependsOnDraws(const torch::lazy::Node* node) {
  for (const torch::lazy::Node* n : torch::lazy::Util::ComputePostOrder(node)) {
    if (isRandomOp(n->op().op)) return true;
    if (const auto* region = dynamic_cast<const RegionNode*>(n); region && region->drawsRandom()) return true;
  }
  return false;
}

bool syncingLiveTensorsForRead() { return t_syncing_live; }

bool syncLiveTensorsBeforeRead(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& tensor : tensors) {
    auto lazy = torch::lazy::TryGetLtcTensor(tensor);
    if (lazy && pendingOnDraws(lazy)) {
      syncLive(lazy->GetDevice());
      return true;
    }
  }
  return false;
}

uint64_t valueKey(const at::Tensor& tensor) {
  auto lazy = torch::lazy::TryGetLtcTensor(tensor);
  if (!lazy) return 0;
  auto pointerHash = [](const void* pointer) { return torch::lazy::Hash(reinterpret_cast<uintptr_t>(pointer)); };
  torch::lazy::hash_t key;
  if (auto data = lazy->CurrentDataHandle()) {
    key = pointerHash(data.get());
  } else if (torch::lazy::Value ir = lazy->CurrentIrValue()) {
    if (dependsOnDraws(ir.node.get())) return 0;
    key = torch::lazy::HashCombine(ir.hash(), torch::lazy::Hash(static_cast<uint64_t>(ir.index)));
    for (const torch::lazy::Node* node : torch::lazy::Util::ComputePostOrder(ir.node.get())) {
      if (const auto* device_data = torch::lazy::DeviceData::Cast(node)) {
        key = torch::lazy::HashCombine(key, pointerHash(device_data->data().get()));
      }
    }
  } else {
    return 0;
  }
  const uint64_t reduced = c10::Uint128Low64(key) ^ c10::Uint128High64(key);
  return reduced == 0 ? 1 : reduced;
}

void syncLiveTensorsOf(const at::Tensor& tensor) {
  auto lazy = torch::lazy::TryGetLtcTensor(tensor);
  TORCH_CHECK(lazy, "lazy_mlir: sync_live_tensors on a tensor that is not lazy (", tensor.device(), ")");
  syncLive(lazy->GetDevice());
}

void registerValueReadKernels() {
  static const bool registered = [] {
    // The library must outlive its registrations: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    library->impl("_local_scalar_dense", TORCH_FN(localScalarDense));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
