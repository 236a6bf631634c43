#include "core/lazy_mlir_backend.h"

#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <torch/csrc/utils/pybind.h>

#include "runtime/run_stats.h"
#include "memory/buffer_donation.h"
#include "core/compiled_computation.h"
#include "ltc_fixes/dead_draws.h"
#include "memory/device_data_pool.h"
#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/host_generator.h"
#include "ltc_fixes/dropout_masks.h"
#include "core/graph_clusterer.h"
#include "core/group_binder.h"
#include "core/layer_regions.h"
#include "ltc_fixes/parameter_binding.h"
#include "core/python_hooks.h"
#include "ltc_fixes/source_locations.h"
#include "nodes/region_node.h"
#include "ltc_fixes/value_reads.h"

namespace lazy_mlir {

namespace {

NodeClass classifyInPython(torch::jit::Node* node) {
  pybind11::gil_scoped_acquire gil;
  auto result = PythonHooks::get().classify.get()(pybind11::cast(node, pybind11::return_value_policy::reference));
  return static_cast<NodeClass>(result.cast<int>());
}

// Python tells mark_step's executions from syncs mid-step (a value read, an
// eager fallback) and records where they came from. LTC's own in_mark_step
// flag cannot: torch 2.13 sets it on value reads too. True under mark_step,
// whose sync takes every live tensor's pending graph (so no graph left
// behind reads this one's inputs later: buffer donation's premise).
// `draws`: the graph runs random ops (a sync mid-step then warns: what
// still depends on them draws again when the step's graph runs), unless
// a read syncs every live tensor (value_reads.h).
bool reportExecution(bool draws) {
  const auto& hook = PythonHooks::get().on_execute;
  if (!hook.defined()) return false;
  const bool host_draws = draws && hostGeneratorMoved();
  if (host_draws) RunStats::get().draws_after_host_use++;
  pybind11::gil_scoped_acquire gil;
  const pybind11::object marking = hook.get()(draws && !syncingLiveTensorsForRead(), host_draws);
  return marking.is(pybind11::bool_(true));
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
  auto computation = std::make_shared<CompiledComputation>(graph, source, key);
  if (binder.anyDonated()) computation->setDonorGroups(BufferDonation::donorGroups(*graph));
  return computation;
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
    if (instances.size() == 1) {
      compiled->setBinding(
          LoweredOutputs::current().bindingOf(*ts->graph(), SyncRecord::current(), ts->parameters_size()));
    }
    results.push_back(compiled);
  }
  RunStats::get().compiles.fetch_add(static_cast<int64_t>(instances.size()));
  RunStats::get().compile_ns.fetch_add(nowNs() - start);
  return results;
}

torch::lazy::BackendDataPtr LazyMlirBackend::CreateDataPlaceholder(const torch::lazy::BackendDevice& device,
                                                                   const torch::lazy::Shape& shape) const {
  SyncRecord::current().onPlaceholder();
  return ts_->CreateDataPlaceholder(device, shape);
}

torch::lazy::BackendDataPtr LazyMlirBackend::GetComputationDataFromNode(const torch::lazy::Node* node) const {
  torch::lazy::BackendDataPtr data = ts_->GetComputationDataFromNode(node);
  SyncRecord::current().onNode(node, data);
  return data;
}

std::shared_ptr<CompiledComputation> LazyMlirBackend::rebind(const SyncRecord& record, const GraphBinding& binding,
                                                             const torch::lazy::BackendDevice& device,
                                                             bool in_mark_step) const {
  const auto& post_order = record.postOrder();
  const char* const why =
      "lazy_mlir: LTC's computation cache returned a graph that reads its parameters at other uses than the "
      "graph being run (same LTC hash, other binding), and the graph could not be lowered again: ";
  TORCH_CHECK(post_order.size() == binding.post_order_size, why, "post-order of ", post_order.size(),
              " nodes, the cached graph's has ", binding.post_order_size);
  auto context = CreateLoweringContext("SyncTensorsGraph", device, post_order, torch::lazy::Util::EmissionMap());
  for (size_t k = 0; k < binding.outputs.size(); ++k) {
    const auto [position, index] = binding.outputs[k];
    const torch::lazy::Node* node = post_order[position];
    TORCH_CHECK(node->hash() == binding.output_hashes[k] && index < node->num_outputs(), why, "output ", k,
                " is not at the cached graph's post-order position ", position);
    context->AddResult(torch::lazy::Output(node, index));
  }
  torch::lazy::ComputationPtr lowered = context->Build();
  lowered->in_mark_step = in_mark_step;
  TORCH_CHECK(lowered->parameters_size() == static_cast<int>(record.numParameters()), why, "it has ",
              lowered->parameters_size(), " parameters, the sync ", record.numParameters());
  auto compiled = std::dynamic_pointer_cast<CompiledComputation>(Compile({lowered}).front());
  TORCH_CHECK(compiled && compiled->binding().known && compiled->binding().uses_hash == record.usesHash(), why,
              "the new lowering does not record the sync's binding");
  RunStats::get().rebinds.fetch_add(1);
  return compiled;
}

std::unique_ptr<torch::lazy::LoweringContext> LazyMlirBackend::CreateLoweringContext(
    const std::string& name, torch::lazy::BackendDevice device,
    c10::ArrayRef<const torch::lazy::Node*> post_order, torch::lazy::Util::EmissionMap emit_status) const {
  const c10::ArrayRef<const torch::lazy::Node*> original_order = post_order;
  const std::vector<const torch::lazy::Node*> reordered = inDrawOrder(post_order);
  if (!reordered.empty()) post_order = reordered;
  auto context = ts_->CreateLoweringContext(name, std::move(device), post_order, std::move(emit_status));
  auto* ts_context = static_cast<torch::lazy::TSLoweringContext*>(context.get());
  // Per lowered value: where it comes from in LTC's post-order (not the draw
  // order; Compile reads the outputs' positions from it), and the source line
  // its op was traced at (the TS lowering names the Python frame current at
  // lowering, mark_step's, on every node). Nodes whose results are small
  // get kSmallResultAttribute: TorchScript graphs carry no sizes, and the
  // clusterer keeps small roots in the glue (graph_clusterer.h). Nodes of a
  // marked layer get its region (layer_regions.h). Dropouts get their sizes
  // (dropout_masks.h).
  static const auto source = c10::Symbol::attr("source");
  static const auto small = c10::Symbol::attr(kSmallResultAttribute);
  static const auto layer_region = c10::Symbol::attr(kRegionAttribute);
  LoweredOutputs& outputs = LoweredOutputs::current();
  outputs.reset(ts_context->graph().get(), original_order.size());
  for (size_t position = 0; position < original_order.size(); ++position) {
    const torch::lazy::Node* node = original_order[position];
    const torch::lazy::SourceLocation* frame = userFrame(node);
    const std::string where =
        frame ? frame->file + " " + frame->function + " " + std::to_string(frame->line) : std::string();
    const int64_t region = layerRegion(node);
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      torch::jit::Value* value = ts_context->GetOutputOp(torch::lazy::Output(node, i));
      outputs.add(value, node, static_cast<uint32_t>(position), static_cast<uint32_t>(i));
      torch::jit::Node* lowered = value->node();
      // a region's ops name their own lines (RegionNode::Lower), else the region's
      const auto* region_node = dynamic_cast<const RegionNode*>(node);
      const std::string* op_where = region_node ? &region_node->outputSource(i) : nullptr;
      if (op_where && !op_where->empty()) {
        lowered->s_(source, *op_where);
      } else if (frame && lowered->hasAttribute(source)) {
        lowered->s_(source, where);
      }
      if (region >= 0 && lowered->kind() != torch::jit::prim::Param) lowered->i_(layer_region, region);
      if (i == 0) tagDropout(*node, lowered, ts_->EagerFallbackDeviceType());
      // (some nodes, ZeRO's collectives among them, carry no shapes)
      if (lowered->kind() != torch::jit::prim::Param && lowered->outputs().size() == 1 &&
          i < node->shapes().size() && node->shape(i).numel() <= kSmallResultElements) {
        lowered->i_(small, 1);
      }
    }
  }
  return context;
}

std::vector<torch::lazy::BackendDataPtr> LazyMlirBackend::ExecuteComputation(
    torch::lazy::ComputationPtr computation, c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
    const torch::lazy::BackendDevice& device) const {
  auto compiled = std::dynamic_pointer_cast<CompiledComputation>(computation);
  const bool draws = compiled && compiled->drawsRandom();
  const bool marking = reportExecution(draws);
  if (draws) {
    forgetDraws();  // what it drew is drawn; a live sync took its dead draws already
    forgetHostGenerator();
  }
  const int64_t start = nowNs();
  DeadBuffers dead;
  if (compiled) {
    // LTC's cache hit may be a graph that reads the parameters at other uses
    // (parameter_binding.h): run the variant lowered for this sync's graph.
    SyncRecord& record = SyncRecord::current();
    const bool described = record.describes(arguments);
    const GraphBinding& binding = compiled->binding();
    if (binding.known && record.usesHash() != binding.uses_hash && described) {
      const bool in_mark_step = compiled->in_mark_step;
      compiled = compiled->forBinding(record.usesHash(), [&] { return rebind(record, binding, device, in_mark_step); });
      computation = compiled;
    }
    record.onExecuted();
    const std::string key = config().second;
    if (compiled->configKey() != key) {  // lazy_mlir.init() changed the config since
      computation = compiled->forConfig(compiled, key, [this](const auto& source) {
        const int64_t compile_start = nowNs();
        auto variant = compileGraph(source);
        RunStats::get().compiles.fetch_add(1);
        RunStats::get().compile_ns.fetch_add(nowNs() - compile_start);
        return variant;
      });
      compiled = std::static_pointer_cast<CompiledComputation>(computation);
    }
    // Which donor candidates' buffers the groups may overwrite (buffer_donation.h).
    if (marking && described && !compiled->donorGroups().empty()) {
      dead = BufferDonation::find(arguments, compiled->donorGroups(), record);
    }
  }
  // The nodes of earlier executions that nothing holds now: their data goes
  // (this graph's own are still held by LTC's sync; device_data_pool.h).
  releasePooledData();
  const DeadBuffers::Scope donations(&dead);
  auto results = ts_->ExecuteComputation(std::move(computation), arguments, device);
  RunStats::get().executions.fetch_add(1);
  RunStats::get().execute_ns.fetch_add(nowNs() - start);
  return results;
}

}  // namespace lazy_mlir
