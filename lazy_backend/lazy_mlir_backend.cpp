#include "lazy_mlir_backend.h"

#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <torch/csrc/utils/pybind.h>

#include "../runtime/run_stats.h"
#include "compiled_computation.h"
#include "draw_order.h"
#include "graph_clusterer.h"
#include "group_binder.h"
#include "python_hooks.h"
#include "source_locations.h"

namespace lazy_mlir {

namespace {

NodeClass classifyInPython(torch::jit::Node* node) {
  pybind11::gil_scoped_acquire gil;
  auto result = PythonHooks::get().classify.get()(pybind11::cast(node, pybind11::return_value_policy::reference));
  return static_cast<NodeClass>(result.cast<int>());
}

// Python tells mark_step's executions from syncs mid-step (a value read, an
// eager fallback) and records where they came from. LTC's own in_mark_step
// flag cannot: torch 2.13 sets it on value reads too.
void reportExecution() {
  const auto& hook = PythonHooks::get().on_execute;
  if (!hook.defined()) return;
  pybind11::gil_scoped_acquire gil;
  hook.get()();
}

}  // namespace

LazyMlirBackend::LazyMlirBackend(const torch::lazy::BackendImplInterface* ts) : ts_(ts) {}

void LazyMlirBackend::configure(Level level, std::string config_key) {
  std::lock_guard<std::mutex> lock(config_mutex_);
  level_ = level;
  config_key_ = std::move(config_key);
}

std::pair<Level, std::string> LazyMlirBackend::config() const {
  std::lock_guard<std::mutex> lock(config_mutex_);
  return {level_, config_key_};
}

std::shared_ptr<CompiledComputation> LazyMlirBackend::compileGraph(
    const std::shared_ptr<torch::jit::Graph>& source) const {
  const auto [lvl, key] = config();
  auto graph = source->copy();
  if (lvl == Level::kO0 || !PythonHooks::get().classify.defined()) {
    return std::make_shared<CompiledComputation>(graph, source, key);
  }
  const std::string name = "graph" + std::to_string(graph_counter_.fetch_add(1));
  torch::jit::EliminateDeadCode(graph);  // e.g. the unused tuples LTC emits for multi-output ops
  GraphClusterer clusterer(graph, classifyInPython);
  auto groups = lvl == Level::kO2 ? clusterer.runWholeGraph() : clusterer.run();
  GroupBinder binder(name);
  for (size_t i = 0; i < groups.size(); ++i) {
    const bool bound = binder.bind(groups[i], static_cast<int>(i));
    TORCH_CHECK(bound || lvl != Level::kO2, "lazy_mlir O2: the step graph ", name,
                " failed to compile (see the warning above); use level=\"O1\" to let failing "
                "groups run in TorchScript");
  }
  torch::jit::EliminateDeadCode(graph);
  return std::make_shared<CompiledComputation>(graph, source, key);
}

std::vector<torch::lazy::ComputationPtr> LazyMlirBackend::Compile(
    std::vector<torch::lazy::ComputationPtr> instances) const {
  const int64_t start = nowNs();
  instances = ts_->Compile(std::move(instances));
  std::vector<torch::lazy::ComputationPtr> results;
  results.reserve(instances.size());
  for (const auto& instance : instances) {
    auto ts = std::dynamic_pointer_cast<torch::lazy::TSComputation>(instance);
    TORCH_CHECK(ts, "lazy_mlir: expected a TorchScript computation from the LTC lowering");
    // The TS computation's graph is the LTC cache's own: keep a private copy.
    auto compiled = compileGraph(ts->graph()->copy());
    compiled->in_mark_step = ts->in_mark_step;
    results.push_back(compiled);
  }
  RunStats::get().compiles.fetch_add(static_cast<int64_t>(instances.size()));
  RunStats::get().compile_ns.fetch_add(nowNs() - start);
  return results;
}

std::unique_ptr<torch::lazy::LoweringContext> LazyMlirBackend::CreateLoweringContext(
    const std::string& name, torch::lazy::BackendDevice device,
    c10::ArrayRef<const torch::lazy::Node*> post_order, torch::lazy::Util::EmissionMap emit_status) const {
  const std::vector<const torch::lazy::Node*> reordered = inDrawOrder(post_order);
  if (!reordered.empty()) post_order = reordered;
  auto context = ts_->CreateLoweringContext(name, std::move(device), post_order, std::move(emit_status));
  // The TS lowering names the Python frame current at lowering (mark_step's)
  // on every node; the trace-time frame is in the IR node's metadata.
  static const auto source = c10::Symbol::attr("source");
  auto* ts_context = static_cast<torch::lazy::TSLoweringContext*>(context.get());
  for (const torch::lazy::Node* node : post_order) {
    const torch::lazy::SourceLocation* frame = userFrame(node);
    if (frame == nullptr) continue;
    const std::string where = frame->file + " " + frame->function + " " + std::to_string(frame->line);
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      torch::jit::Node* lowered = ts_context->GetOutputOp(torch::lazy::Output(node, i))->node();
      if (lowered->hasAttribute(source)) lowered->s_(source, where);
    }
  }
  return context;
}

std::vector<torch::lazy::BackendDataPtr> LazyMlirBackend::ExecuteComputation(
    torch::lazy::ComputationPtr computation, c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
    const torch::lazy::BackendDevice& device) const {
  reportExecution();
  const int64_t start = nowNs();
  if (auto compiled = std::dynamic_pointer_cast<CompiledComputation>(computation)) {
    const std::string key = config().second;
    if (compiled->configKey() != key) {  // lazy_mlir.init() changed the config since
      computation = compiled->forConfig(compiled, key, [this](const auto& source) {
        const int64_t compile_start = nowNs();
        auto variant = compileGraph(source);
        RunStats::get().compiles.fetch_add(1);
        RunStats::get().compile_ns.fetch_add(nowNs() - compile_start);
        return variant;
      });
    }
  }
  auto results = ts_->ExecuteComputation(std::move(computation), arguments, device);
  RunStats::get().executions.fetch_add(1);
  RunStats::get().execute_ns.fetch_add(nowNs() - start);
  return results;
}

}  // namespace lazy_mlir
