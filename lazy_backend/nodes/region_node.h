// RegionNode: a recorded sequence of aten ops replayed as one LTC IR node.
//
// lazy_mlir.capture records a module's forward and backward once (as FX
// graphs of aten ops, through AOTAutograd). Each later call then traces one
// RegionNode instead of every op: no Python, autograd, functionalization or
// LTC work per op. Its lowering emits the recorded ops as the TorchScript
// builtins LTC's own nodes lower to, so clustering, compiling and the
// TorchScript fallbacks see the graph a per-op trace would have built.
#pragma once

#include "nodes/builtin_op_node.h"

#include <torch/csrc/lazy/core/tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lazy_mlir {

// One recorded op: its tensor operands index the region's values (the
// region's inputs, then each op's outputs in order, Tensor[] flattened).
struct RegionOp {
  c10::Symbol op;
  std::vector<BuiltinOpNode::Argument> arguments;
  std::vector<int64_t> list_sizes;  // as for BuiltinOpNode
  size_t num_outputs = 0;
  std::optional<torch::lazy::Shape> shape;  // its first output's, where the lowering needs it (native_dropout)
  std::string source;  // "file function line" of the user's line that traced it; empty: the region's own
};

struct Region {
  std::string name;  // for messages and IR dumps
  size_t num_inputs = 0;
  std::vector<RegionOp> ops;
  std::vector<size_t> outputs;  // value indices
  std::vector<torch::lazy::Shape> output_shapes;
  std::vector<std::string> output_sources;  // of each output: its op's source (empty: none recorded)
  torch::lazy::hash_t hash;  // ops, constants and wiring
  bool draws_random = false;  // one of its ops draws (draw_order.h's kinds): asked at every trace
};

class RegionNode : public torch::lazy::TsNode {
 public:
  RegionNode(std::shared_ptr<const Region> region, torch::lazy::OpList operands);

  torch::lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                                torch::lazy::TSLoweringContext* loctx) const override;

  std::string ToString() const override;

  // The source line of the op that computes output `index` ("file function
  // line"), or empty where the record kept none (a backward's ops).
  const std::string& outputSource(size_t index) const;

  // Whether one of its ops draws random numbers (draw_order.h's kinds).
  bool drawsRandom() const;

 private:
  std::shared_ptr<const Region> region_;
};

// Builds a region from Python: `ops` holds one (qualified_name, overload,
// arguments, list_sizes, num_outputs) tuple per op, the schema's arguments in
// order, each ("value", index), ("values", [index or None, ...]) or
// ("constant", value).
std::shared_ptr<Region> makeRegion(const std::string& name, size_t num_inputs, const pybind11::list& ops,
                                   const std::vector<size_t>& outputs,
                                   const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& output_shapes);

// Traces one RegionNode over `inputs` (lazy tensors, functionalized or not)
// and returns its outputs, functionalized like the inputs.
std::vector<at::Tensor> traceRegion(const std::shared_ptr<Region>& region, const std::vector<at::Tensor>& inputs);

// What a forward region saves for its backward region: its outputs from the
// user's on, held as lazy tensors only. They are live tensors, so that a sync
// before the backward computes them with the forward and the backward reads
// them as data; but no aten tensor, Python object or SavedVariable is made
// per value (a CNN saves ~100 per step).
class SavedValues {
 public:
  SavedValues(std::vector<torch::lazy::LazyTensorPtr> values, std::vector<std::optional<at::Tensor>> leaves)
      : values_(std::move(values)), leaves_(std::move(leaves)) {}
  size_t size() const { return values_.size(); }
  bool released() const { return released_; }
  // The values as the backward region's first operands; then, as autograd
  // frees saved tensors after a backward that keeps no graph, dropped (the
  // step's graph would otherwise also return them while the loss lives).
  std::vector<torch::lazy::Value> take();
  // The forward's inputs that are leaves requiring a gradient (none for the
  // others), for storeLeafGrads.
  const std::vector<std::optional<at::Tensor>>& leaves() const { return leaves_; }
  // As aten lazy tensors (tests, debugging).
  std::vector<at::Tensor> tensors() const;

 private:
  std::vector<torch::lazy::LazyTensorPtr> values_;
  std::vector<std::optional<at::Tensor>> leaves_;
  bool released_ = false;
};

// Traces a forward region: returns its outputs [saved_begin, saved_end) as
// SavedValues, the others in order as traceRegion does.
std::pair<std::vector<at::Tensor>, std::shared_ptr<SavedValues>> traceRegionSaving(
    const std::shared_ptr<Region>& region, const std::vector<at::Tensor>& inputs, size_t saved_begin,
    size_t saved_end);

// A direct replay's backward: the backward region traced over `saved`'s
// values, `grads` and `constants`. Returns each forward input's gradient
// (`positions`: its region output, or none); unless `create_graph`, those of
// the forward's leaf inputs are stored into .grad where storeLeafGrads may
// (leaf_grads.h) and returned as none.
std::vector<std::optional<at::Tensor>> replayBackward(const std::shared_ptr<Region>& region,
                                                      const std::shared_ptr<SavedValues>& saved,
                                                      const std::vector<at::Tensor>& grads,
                                                      const std::vector<at::Tensor>& constants,
                                                      const std::vector<std::optional<size_t>>& positions,
                                                      bool create_graph);

}  // namespace lazy_mlir
