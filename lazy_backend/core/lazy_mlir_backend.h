// LazyMlirBackend: the LTC backend of lazy_mlir. It forwards everything to
// the TorchScript backend except Compile, where it clusters the graph into
// fusion groups and binds each to a CompiledGroup, and ExecuteComputation,
// which it counts and times (and where it recompiles a computation made
// under an older configuration, or lowered for another parameter binding than
// the sync's: parameter_binding.h).
#pragma once

#include <torch/csrc/lazy/backend/backend_interface.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "core/compiled_computation.h"
#include "core/backend_ir_builder.h"

namespace lazy_mlir {

enum class Level { kO0 = 0, kO1 = 1, kO2 = 2 };

class LazyMlirBackend : public torch::lazy::BackendImplInterface {
 public:
  explicit LazyMlirBackend(const torch::lazy::BackendImplInterface* ts);

  // Level and a key naming every option that changes compiled code.
  void configure(Level level, std::string config_key);

  std::vector<torch::lazy::ComputationPtr> Compile(
      std::vector<torch::lazy::ComputationPtr> instances) const override;
  std::vector<torch::lazy::BackendDataPtr> ExecuteComputation(
      torch::lazy::ComputationPtr computation, c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
      const torch::lazy::BackendDevice& device) const override;

  // ---- forwarded unchanged to the TorchScript backend ----
  void InitializeAtenBindings() const override { ts_->InitializeAtenBindings(); }
  void PrepareToExit() const override { ts_->PrepareToExit(); }
  void SetRngSeed(size_t seed) const override { ts_->SetRngSeed(seed); }
  const torch::lazy::IrBuilder* GetIrBuilder() const override { return backendIrBuilder(ts_->GetIrBuilder()); }
  torch::lazy::BackendDataPtr MakeComputationDataFromTensor(
      const at::Tensor& tensor, const torch::lazy::Shape& shape,
      const torch::lazy::BackendDevice& device) const override {
    return ts_->MakeComputationDataFromTensor(tensor, shape, device);
  }
  torch::lazy::BackendDataPtr MakeComputationDataFromScalar(
      const at::Scalar& scalar, const torch::lazy::BackendDevice& device) const override {
    return ts_->MakeComputationDataFromScalar(scalar, device);
  }
  // These two also record the sync's post-order and parameter binding
  // (parameter_binding.h): LTC makes the sync's output placeholders, then asks
  // for each post-order node's data.
  torch::lazy::BackendDataPtr CreateDataPlaceholder(const torch::lazy::BackendDevice& device,
                                                    const torch::lazy::Shape& shape) const override;
  // LTC calls it once per node of a sync's post-order walk, and each call is
  // recorded as the walk's next node (SyncRecord, parameter_binding.h): code
  // of ours that only asks whether a node is device data uses
  // DeviceData::Cast instead.
  torch::lazy::BackendDataPtr GetComputationDataFromNode(const torch::lazy::Node* node) const override;
  at::Tensor MakeTensorFromComputationData(const torch::lazy::BackendDataPtr data,
                                           std::optional<at::ScalarType> type) const override {
    return ts_->MakeTensorFromComputationData(data, type);
  }
  // Lowers through the TS backend, random ops in trace order (draw_order.h),
  // then stamps each TorchScript node with the source line recorded when its
  // op was traced.
  std::unique_ptr<torch::lazy::LoweringContext> CreateLoweringContext(
      const std::string& name, torch::lazy::BackendDevice device,
      c10::ArrayRef<const torch::lazy::Node*> post_order,
      torch::lazy::Util::EmissionMap emit_status) const override;
  std::unique_ptr<torch::lazy::LoweringContext> CreateLoweringContext(
      const std::string& name, torch::lazy::BackendDevice device) const override {
    return ts_->CreateLoweringContext(name, std::move(device));
  }
  std::vector<std::string> GetCompilationDevices(const std::string& device,
                                                 c10::ArrayRef<std::string> devices) const override {
    return ts_->GetCompilationDevices(device, devices);
  }
  std::shared_ptr<torch::lazy::BackendDeviceType> GetDefaultDeviceType() const override {
    return ts_->GetDefaultDeviceType();
  }
  void SetDefaultDeviceType(int8_t type) override {
    const_cast<torch::lazy::BackendImplInterface*>(ts_)->SetDefaultDeviceType(type);
  }
  int64_t GetDefaultDeviceOrdinal() const override { return ts_->GetDefaultDeviceOrdinal(); }
  void SetDefaultDeviceOrdinal(int64_t ordinal) override {
    const_cast<torch::lazy::BackendImplInterface*>(ts_)->SetDefaultDeviceOrdinal(ordinal);
  }
  at::DeviceType EagerFallbackDeviceType() const override { return ts_->EagerFallbackDeviceType(); }
  std::vector<torch::lazy::BackendDevice> GetBackendDevices() const override {
    return ts_->GetBackendDevices();
  }
  std::string CreateMetricReport() const override { return ts_->CreateMetricReport(); }
  torch::lazy::BackendDevice GetBackendDevice(c10::Device device) const override {
    return ts_->GetBackendDevice(device);
  }
  std::string GetComputationBackendText(const torch::lazy::ComputationPtr computation) const override {
    return ts_->GetComputationBackendText(computation);
  }

 private:
  std::pair<Level, std::string> config() const;
  std::shared_ptr<CompiledComputation> compileGraph(const std::shared_ptr<torch::jit::Graph>& source) const;
  // Lowers and compiles the graph of `record` (the sync being executed) with
  // the outputs `binding` places; fails loudly if the graph is not shaped so.
  std::shared_ptr<CompiledComputation> rebind(const SyncRecord& record, const GraphBinding& binding,
                                              const torch::lazy::BackendDevice& device, bool in_mark_step) const;

  const torch::lazy::BackendImplInterface* ts_;
  mutable std::mutex config_mutex_;
  Level level_ = Level::kO1;
  std::string config_key_;
  mutable std::atomic<int64_t> graph_counter_{0};
};

}  // namespace lazy_mlir
