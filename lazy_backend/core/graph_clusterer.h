// GraphClusterer: partitions the compilable nodes of an LTC TorchScript graph
// into prim::FusionGroup nodes. Which nodes are compilable is decided by a
// classifier supplied from Python. "Plumbing" nodes (constants,
// ScalarImplicit, list construction) never start a group but join their
// consumer's group, so scalar arguments never split groups.
//
// LTC graphs are functional DAGs, so we partition by "barrier depth": the
// largest number of non-compilable nodes on any path from the inputs; a
// compilable node then moves as late as its readers allow. All compilable
// nodes of one depth form one group. A path from a group back to
// itself would cross a non-compilable node and so raise the depth, hence the
// groups can never form a cycle, and each group is as large as it can be.
// Random draws left in the graph keep their order (draw_order.h): each counts
// as an input of the next, for the depth and for the order of the nodes.
// Where a model's layers are marked (layer_regions.h), O1 groups only nodes
// of one layer region too.
//
// Small roots computed only from graph inputs and other roots (a loss summed
// across steps, `running_loss += loss.detach()` before or after mark_step,
// which the first step starts from a Python float) stay in the glue when the
// graph computes anything else: in a group they would make that step's group
// differ from the other steps', a compile of the whole step for a scalar op.
// In the glue they cost a TorchScript op each, and the group is reused. A
// graph of such roots alone (the running loss read after the last step)
// still compiles: a graph of small ops is what an op's test compiles.
//
// A detach or alias copy of a graph input (a frozen weight at the first
// step after the model moved) is forwarded to its readers for the same
// reason: the first step's groups are then every later step's.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace lazy_mlir {

// Set by the lowering (LazyMlirBackend::CreateLoweringContext) on nodes
// whose result has at most kSmallResultElements elements: TorchScript graphs
// carry no sizes. The clusterer removes it from the graph it clusters.
constexpr const char* kSmallResultAttribute = "small_result";
constexpr int64_t kSmallResultElements = 1024;

enum class NodeClass { kNotCompilable = 0, kCompute = 1, kPlumbing = 2 };

// "at <file> <function> <line>" from the source attribute LTC puts on nodes.
std::string describeSource(const torch::jit::Node* node);

class GraphClusterer {
 public:
  using Classifier = std::function<NodeClass(torch::jit::Node*)>;

  GraphClusterer(std::shared_ptr<torch::jit::Graph> graph, Classifier classify);

  // O1: clusters the graph in place and returns the fusion group nodes in
  // graph order.
  std::vector<torch::jit::Node*> run();

  // O2: puts every node into one group; throws, naming the op and its source
  // line, if a node is not compilable.
  std::vector<torch::jit::Node*> runWholeGraph();

 private:
  void forwardCopiesOfInputs();
  void splitSharedPlumbing();
  void classifyNodes();
  void keepSmallRootsInGlue();
  std::vector<torch::jit::Node*> predecessors(torch::jit::Node* n) const;
  std::unordered_map<torch::jit::Node*, int64_t> takeRegions();
  void mergeRegionsAcrossScalars(std::unordered_map<torch::jit::Node*, int64_t>& region) const;
  void placeLate(std::unordered_map<torch::jit::Node*, int>& depth) const;
  void assignGroups(bool by_layer);
  void orderNodesByGroup();
  std::vector<torch::jit::Node*> buildGroups();

  std::shared_ptr<torch::jit::Graph> graph_;
  Classifier classify_;
  std::unordered_map<torch::jit::Node*, NodeClass> class_;
  std::unordered_map<torch::jit::Node*, int> group_;  // node -> group id; absent: stays outside
  std::unordered_map<torch::jit::Node*, torch::jit::Node*> previous_draw_;
  std::unordered_set<torch::jit::Node*> input_copies_;  // returned copies of graph inputs: glue
  int num_groups_ = 0;
  bool whole_graph_ = false;
};

}  // namespace lazy_mlir
