#include "core/backend_graph_executor.h"

#include "core/layer_regions.h"
#include "ltc_fixes/dead_draws.h"
#include "ltc_fixes/host_generator.h"
#include "ltc_fixes/draw_stream.h"
#include "ltc_fixes/pending_data.h"
#include "memory/device_data_pool.h"
#include "optimizer/functional_update.h"
#include "runtime/step_memory.h"

#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/internal_ops/ltc_ops.h>
#include <torch/csrc/lazy/core/ir_util.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ops/device_data.h>

#include <string>
#include <unordered_set>

namespace lazy_mlir {
namespace {

// The last line of what the last failed sync raised (a TorchScript error's
// own message comes last), "" while none failed.
std::string& lastFailure() {
  static std::string failure;
  return failure;
}

bool lacksValue(const torch::lazy::BackendDataPtr& data) { return data && !data->HasValue(); }

// The `tensors` pending on a value that a failed sync was to compute: LTC
// gives a sync's outputs their data handles before the graph runs, and a
// graph that raises leaves them empty. Each becomes such a valueless handle
// itself: it cannot be computed either, and a tensor that only holds one
// (the failed step's loss kept in a list, a model dropped but not yet
// collected) syncs nothing. Returns how many were pending on one, and
// through `any_lost` whether any tensor holds or reads one still.
size_t dropPendingOnLostValues(const std::vector<torch::lazy::LazyTensorPtr>& tensors, bool* any_lost) {
  std::vector<const torch::lazy::Node*> roots;
  *any_lost = false;
  for (const auto& tensor : tensors) {
    if (lacksValue(tensor->CurrentDataHandle())) *any_lost = true;
    if (torch::lazy::Value ir = tensor->CurrentIrValue()) roots.push_back(ir.node.get());
  }
  std::unordered_set<const torch::lazy::Node*> reads_lost;  // one pass over the graph the tensors share
  for (const torch::lazy::Node* node : torch::lazy::Util::ComputePostOrder(roots)) {
    const auto* device_data = torch::lazy::DeviceData::Cast(node);
    bool lost = device_data && lacksValue(device_data->data());
    for (const torch::lazy::Output& operand : node->operands()) lost = lost || reads_lost.count(operand.node);
    if (lost) reads_lost.insert(node);
  }
  size_t dropped = 0;
  for (const auto& tensor : tensors) {
    torch::lazy::Value ir = tensor->CurrentIrValue();
    if (!ir || !reads_lost.count(ir.node.get())) continue;
    tensor->SetDataHandle(
        torch::lazy::getBackend()->CreateDataPlaceholder(tensor->GetDevice(), tensor->shape().Get()));
    ++dropped;
  }
  *any_lost = *any_lost || dropped > 0;
  return dropped;
}

class BackendGraphExecutor : public torch::lazy::LazyGraphExecutor {
 public:
  void SyncLiveTensorsGraph(const torch::lazy::BackendDevice* device, c10::ArrayRef<std::string> devices,
                            bool wait) override {
    auto tensors = GetLiveTensors(device);  // as LTC's own, but for the order
    if (!lastFailure().empty()) {
      // After a failed step, its outputs (the parameters and optimizer
      // state it updated among them) hold no value: say so, not TorchScript's
      // "Expected a proper Tensor but got None" from deep in the next graph.
      bool any_lost = false;
      const size_t lost = dropPendingOnLostValues(tensors, &any_lost);
      if (!any_lost) lastFailure().clear();  // nothing refers to the failed step's results any more
      TORCH_CHECK(lost == 0, "lazy_mlir: ", lost, " tensors of this step read values that an earlier step was to "
                  "compute when it failed (", lastFailure(), "). That step's results were never computed: the "
                  "parameters and optimizer state it updated hold no value, and copying into them reads it. "
                  "Build the model and optimizer anew (from a checkpoint, then .to(\"lazy\")) before the next "
                  "step.");
    }
    orderUpdatedLast(tensors);
    addDeadDraws(&tensors, device ? *device : torch::lazy::BackendDevice());
    try {
      SyncTensorsGraph(&tensors, devices, wait, /*sync_ltc_data=*/true);
    } catch (const std::exception& error) {
      std::string what = error.what();
      while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
      const size_t line = what.rfind('\n');
      lastFailure() = what.empty() ? "an error" : what.substr(line == std::string::npos ? 0 : line + 1);
      forgetHostGenerator();  // the failed step's draws never ran; the next step notes its own
      throw;
    }
    drawsSettled();
  }

  void MarkStep(const torch::lazy::BackendDevice& device) override {
    torch::lazy::LazyGraphExecutor::MarkStep(device);
    newDrawStream();
    forgetHostGenerator();  // a draw traced and never run (its tensors dropped) says nothing of the next step
    clearLayerBoundaries();
    devicePoolStepBoundary();
    stepMemoryStepEnded();
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
