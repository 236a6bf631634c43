#include "nodes/region_node.h"

#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/host_generator.h"
#include "ltc_fixes/dropout_masks.h"
#include "capture/leaf_grads.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>

#include <sstream>

namespace lazy_mlir {

namespace {

const c10::Symbol kRegion = c10::Symbol::fromQualString("lazy_mlir::region");

}  // namespace

RegionNode::RegionNode(std::shared_ptr<const Region> region, torch::lazy::OpList operands)
    : TsNode(torch::lazy::OpKind(kRegion), operands, std::vector<torch::lazy::Shape>(region->output_shapes),
             region->output_shapes.size(), region->hash),
      region_(std::move(region)) {}

torch::lazy::TSOpVector RegionNode::Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                                          torch::lazy::TSLoweringContext* loctx) const {
  // Each op names its own source line where the record kept one, as the
  // per-op trace does (LazyMlirBackend::CreateLoweringContext names the
  // region's outputs: outputSource).
  static const auto source = c10::Symbol::attr("source");
  std::vector<torch::jit::Value*> values;
  values.reserve(region_->num_inputs);
  for (size_t i = 0; i < region_->num_inputs; ++i) values.push_back(loctx->GetOutputOp(operand(i)));
  for (const auto& op : region_->ops) {
    auto outputs = lowerBuiltinCall(function, op.op, op.arguments, op.list_sizes,
                                    [&](size_t index) { return values.at(index); });
    TORCH_CHECK(outputs.size() == op.num_outputs, "lazy_mlir: region ", region_->name, ": ",
                op.op.toQualString(), " lowered to ", outputs.size(), " values, recorded ", op.num_outputs);
    if (!op.source.empty()) {
      for (auto* output : outputs) output->node()->s_(source, op.source);
    }
    if (op.shape) tagDropout(outputs.at(0)->node(), *op.shape, torch::lazy::getBackend()->EagerFallbackDeviceType());
    values.insert(values.end(), outputs.begin(), outputs.end());
  }
  torch::lazy::TSOpVector results;
  for (size_t index : region_->outputs) results.push_back(values.at(index));
  return results;
}

const std::string& RegionNode::outputSource(size_t index) const { return region_->output_sources.at(index); }

std::string RegionNode::ToString() const {
  std::ostringstream ss;
  ss << TsNode::ToString() << ", region=" << region_->name << ", ops=" << region_->ops.size();
  return ss.str();
}

bool RegionNode::drawsRandom() const { return region_->draws_random; }

std::shared_ptr<Region> makeRegion(const std::string& name, size_t num_inputs, const pybind11::list& ops,
                                   const std::vector<size_t>& outputs,
                                   const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& output_shapes) {
  auto region = std::make_shared<Region>();
  region->name = name;
  region->num_inputs = num_inputs;
  torch::lazy::hash_t hash = torch::lazy::Hash(static_cast<uint64_t>(num_inputs));
  size_t num_values = num_inputs;
  std::vector<std::string> value_sources(num_inputs);  // of each value: its op's source line
  auto checkedIndex = [&](pybind11::handle index) {
    size_t i = index.cast<size_t>();
    TORCH_CHECK(i < num_values, "lazy_mlir: region ", name, " reads value ", i, " before it is defined");
    hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(static_cast<uint64_t>(i)));
    return i;
  };
  for (auto item : ops) {
    auto entry = item.cast<pybind11::tuple>();
    const auto qualified_name = entry[0].cast<std::string>();
    const auto overload = entry[1].cast<std::string>();
    const auto& schema = findSchema(qualified_name, overload);
    auto args = entry[2].cast<pybind11::list>();
    TORCH_CHECK(args.size() == schema.arguments().size(), "lazy_mlir: region ", name, ": ", qualified_name,
                " expects ", schema.arguments().size(), " arguments, got ", args.size());
    RegionOp op;
    op.op = c10::Symbol::fromQualString(qualified_name);
    op.list_sizes = entry[3].cast<std::vector<int64_t>>();
    op.num_outputs = entry[4].cast<size_t>();
    hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(qualified_name + "." + overload));
    if (entry.size() > 5 && !entry[5].is_none()) {
      auto [dtype, sizes] = entry[5].cast<std::pair<at::ScalarType, std::vector<int64_t>>>();
      op.shape = torch::lazy::Shape(dtype, sizes);
      hash = torch::lazy::HashCombine(hash, op.shape->hash(/*bakeInSizes=*/true));
    }
    if (entry.size() > 6 && !entry[6].is_none()) op.source = entry[6].cast<std::string>();  // not in the hash
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& formal = schema.arguments()[i];
      auto arg = args[i].cast<pybind11::tuple>();
      const auto kind = arg[0].cast<std::string>();
      BuiltinOpNode::Argument a{formal.name(), formal.kwarg_only(), std::nullopt, {}};
      if (kind == "value") {
        a.operand = checkedIndex(arg[1]);
      } else if (kind == "values") {
        a.operand_list.emplace();
        a.list_type = formal.type();
        for (auto index : arg[1]) {
          a.operand_list->push_back(index.is_none() ? std::nullopt : std::optional<size_t>(checkedIndex(index)));
          if (index.is_none()) hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(std::string("None")));
        }
      } else {
        TORCH_CHECK(kind == "constant", "lazy_mlir: region argument kind ", kind);
        // A number where the schema has a Tensor (FX's add.Tensor(x, 2)) stays
        // a number: the lowering's overload resolution then picks the Scalar
        // overload, with a wrapped number's type promotion, as eager does.
        const bool number_for_tensor = formal.type()->isSubtypeOf(*c10::OptionalType::ofTensor()) &&
                                       (pybind11::isinstance<pybind11::int_>(arg[1]) ||
                                        pybind11::isinstance<pybind11::float_>(arg[1]));
        a.constant = torch::jit::toIValue(arg[1], number_for_tensor ? c10::NumberType::get() : formal.type());
        hash = torch::lazy::HashCombine(hash, hashConstant(a.constant));
      }
      op.arguments.push_back(std::move(a));
    }
    num_values += op.num_outputs;
    value_sources.resize(num_values, op.source);
    region->draws_random = region->draws_random || isRandomOp(op.op);
    region->ops.push_back(std::move(op));
  }
  for (size_t index : outputs) {
    TORCH_CHECK(index < num_values, "lazy_mlir: region ", name, " returns undefined value ", index);
    hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(static_cast<uint64_t>(index)));
    region->output_sources.push_back(value_sources.at(index));
  }
  region->outputs = outputs;
  TORCH_CHECK(outputs.size() == output_shapes.size(), "lazy_mlir: region ", name, ": ", outputs.size(),
              " outputs, ", output_shapes.size(), " shapes");
  for (const auto& [dtype, sizes] : output_shapes) {
    region->output_shapes.emplace_back(dtype, sizes);
    hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(sizes));
    hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(static_cast<int64_t>(dtype)));
  }
  region->hash = hash;
  return region;
}

namespace {

namespace fimpl = at::functionalization::impl;

struct TracedNode {
  torch::lazy::NodePtr node;
  torch::lazy::BackendDevice device;
  bool functional = false;  // the inputs were functionalized: so are the outputs
};

// The region's node over `operands` (IR values) and then the values of the
// lazy tensors of each of `inputs`, functionalized or not.
TracedNode traceNode(const std::shared_ptr<Region>& region, std::vector<torch::lazy::Value> operands,
                     std::initializer_list<const std::vector<at::Tensor>*> inputs) {
  std::optional<torch::lazy::BackendDevice> device;
  bool functional = false;
  for (const auto* tensors : inputs) {
    for (at::Tensor input : *tensors) {
      if (fimpl::isFunctionalTensor(input)) {
        functional = true;
        fimpl::sync(input);
        input = fimpl::from_functional_tensor(input);
      }
      auto lazy = torch::lazy::TryGetLtcTensor(input);
      TORCH_CHECK(lazy, "lazy_mlir: region ", region->name, ": input ", operands.size(), " is not a lazy tensor (",
                  input.device(), ")");
      if (!device) device = lazy->GetDevice();
      operands.push_back(lazy->GetIrValue());
    }
  }
  TORCH_CHECK(operands.size() == region->num_inputs, "lazy_mlir: region ", region->name, " takes ",
              region->num_inputs, " inputs, got ", operands.size());
  TORCH_CHECK(device, "lazy_mlir: region ", region->name, " called without inputs");
  if (region->draws_random) noteDrawTraced();
  return {torch::lazy::MakeNode<RegionNode>(region, operands), *device, functional};
}

// Outputs [begin, end) of `node` as aten lazy tensors, functionalized if
// the inputs were.
std::vector<at::Tensor> outputTensors(const torch::lazy::NodePtr& node, size_t begin, size_t end,
                                      const torch::lazy::BackendDevice& device, bool functional) {
  std::vector<at::Tensor> results;
  results.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) {
    at::Tensor out = torch::lazy::CreateAtenFromLtcTensor(
        torch::lazy::LazyTensor::Create(torch::lazy::Value(node, i), device));
    results.push_back(functional ? fimpl::to_functional_tensor(out) : out);
  }
  return results;
}

}  // namespace

std::vector<at::Tensor> traceRegion(const std::shared_ptr<Region>& region, const std::vector<at::Tensor>& inputs) {
  const TracedNode traced = traceNode(region, {}, {&inputs});
  return outputTensors(traced.node, 0, region->outputs.size(), traced.device, traced.functional);
}

std::pair<std::vector<at::Tensor>, std::shared_ptr<SavedValues>> traceRegionSaving(
    const std::shared_ptr<Region>& region, const std::vector<at::Tensor>& inputs, size_t saved_begin,
    size_t saved_end) {
  const size_t num_outputs = region->outputs.size();
  TORCH_CHECK(saved_begin <= saved_end && saved_end <= num_outputs, "lazy_mlir: region ", region->name, " has ",
              num_outputs, " outputs, cannot save [", saved_begin, ", ", saved_end, ")");
  const TracedNode traced = traceNode(region, {}, {&inputs});
  std::vector<torch::lazy::LazyTensorPtr> saved;
  saved.reserve(saved_end - saved_begin);
  for (size_t i = saved_begin; i < saved_end; ++i) {
    saved.push_back(torch::lazy::LazyTensor::Create(torch::lazy::Value(traced.node, i), traced.device));
  }
  std::vector<std::optional<at::Tensor>> leaves;
  leaves.reserve(inputs.size());
  for (const at::Tensor& input : inputs) {
    leaves.push_back(input.is_leaf() && input.requires_grad() ? std::optional<at::Tensor>(input) : std::nullopt);
  }
  auto outputs = outputTensors(traced.node, 0, saved_begin, traced.device, traced.functional);
  auto after = outputTensors(traced.node, saved_end, num_outputs, traced.device, traced.functional);
  outputs.insert(outputs.end(), after.begin(), after.end());
  return {std::move(outputs), std::make_shared<SavedValues>(std::move(saved), std::move(leaves))};
}

std::vector<torch::lazy::Value> SavedValues::take() {
  TORCH_CHECK(!released_, "Trying to backward through the graph a second time (or directly access saved tensors "
              "after they have already been freed). Saved intermediate values of the graph are freed when you call "
              ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph "
              "a second time or if you need to access saved tensors after calling backward.");
  std::vector<torch::lazy::Value> values;
  values.reserve(values_.size());
  for (const auto& value : values_) values.push_back(value->GetIrValue());
  if (!torch::autograd::get_current_graph_task_keep_graph()) {
    values_.clear();
    released_ = true;
  }
  return values;
}

std::vector<at::Tensor> SavedValues::tensors() const {
  std::vector<at::Tensor> tensors;
  for (const auto& value : values_) tensors.push_back(torch::lazy::CreateAtenFromLtcTensor(value));
  return tensors;
}

std::vector<std::optional<at::Tensor>> replayBackward(const std::shared_ptr<Region>& region,
                                                      const std::shared_ptr<SavedValues>& saved,
                                                      const std::vector<at::Tensor>& grads,
                                                      const std::vector<at::Tensor>& constants,
                                                      const std::vector<std::optional<size_t>>& positions,
                                                      bool create_graph) {
  const TracedNode traced = traceNode(region, saved->take(), {&grads, &constants});
  auto outputs = outputTensors(traced.node, 0, region->outputs.size(), traced.device, traced.functional);
  std::vector<std::optional<at::Tensor>> results;
  results.reserve(positions.size());
  for (const auto& position : positions) {
    results.push_back(position ? std::optional<at::Tensor>(outputs.at(*position)) : std::nullopt);
  }
  if (create_graph) return results;  // AccumulateGrad then stores a clone
  const auto& leaves = saved->leaves();
  TORCH_CHECK(leaves.size() >= results.size(), "lazy_mlir: region ", region->name, " returns ", results.size(),
              " gradients for ", leaves.size(), " forward inputs");
  std::vector<std::optional<at::Tensor>> arguments(leaves.begin(),
                                                   leaves.begin() + static_cast<std::ptrdiff_t>(results.size()));
  return storeLeafGrads(arguments, std::move(results));
}

}  // namespace lazy_mlir
