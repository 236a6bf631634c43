#include "core/backend_graph_executor.h"

#include "core/layer_regions.h"
#include "ltc_fixes/dead_draws.h"
#include "ltc_fixes/draw_stream.h"
#include "ltc_fixes/pending_data.h"
#include "memory/device_data_pool.h"
#include "optimizer/functional_update.h"

#include <torch/csrc/lazy/core/internal_ops/ltc_ops.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>

namespace lazy_mlir {
namespace {

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
    torch::lazy::LazyGraphExecutor::MarkStep(device);
    newDrawStream();
    clearLayerBoundaries();
    devicePoolStepBoundary();
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

void installGraphExecutor() {
  static BackendGraphExecutor* executor = [] {
    auto* created = new BackendGraphExecutor();
    torch::lazy::LazyGraphExecutor::Register(created);
    return created;
  }();
  (void)executor;
}

}  // namespace lazy_mlir
