#include "core/graph_clusterer.h"

#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/dropout_masks.h"
#include "core/layer_regions.h"

#include <map>
#include <queue>
#include <unordered_set>

namespace lazy_mlir {

using torch::jit::Node;
using torch::jit::Value;
namespace prim = torch::jit::prim;
namespace SubgraphUtils = torch::jit::SubgraphUtils;

namespace {

bool isTensor(const Value* v) { return v->type()->isSubtypeOf(*c10::TensorType::get()); }

bool allTensors(c10::ArrayRef<Value*> values) {
  return std::all_of(values.begin(), values.end(), isTensor);
}

}  // namespace

std::string describeSource(const Node* node) {
  static const auto source = c10::Symbol::attr("source");
  if (node->hasAttribute(source) && node->kindOf(source) == torch::jit::AttributeKind::s) {
    return "at " + node->s(source);
  }
  return "source line unknown";
}

GraphClusterer::GraphClusterer(std::shared_ptr<torch::jit::Graph> graph, Classifier classify)
    : graph_(std::move(graph)), classify_(std::move(classify)) {}

// A plumbing node used by several consumers would have to be a group output
// of non-tensor type: give every use its own copy (they are pure and cheap).
void GraphClusterer::splitSharedPlumbing() {
  std::vector<Node*> nodes(graph_->nodes().begin(), graph_->nodes().end());
  for (Node* n : nodes) {
    class_[n] = input_copies_.count(n) ? NodeClass::kNotCompilable : classify_(n);
  }
  for (Node* n : nodes) {
    if (class_[n] != NodeClass::kPlumbing || n->outputs().size() != 1) continue;
    auto uses = n->output()->uses();
    for (size_t i = 1; i < uses.size(); ++i) {
      Node* copy = graph_->createClone(n, [](Value* v) { return v; });
      copy->insertBefore(uses[i].user);
      class_[copy] = NodeClass::kPlumbing;
      uses[i].user->replaceInput(uses[i].offset, copy->output());
    }
  }
}

// A node that takes a non-tensor value from outside any group cannot be
// compiled (groups exchange Tensor[] only); this propagates forward.
void GraphClusterer::classifyNodes() {
  splitSharedPlumbing();
  for (Node* n : graph_->nodes()) {
    if (class_[n] == NodeClass::kNotCompilable) continue;
    for (Value* v : n->inputs()) {
      Node* p = v->node();
      if (!isTensor(v) && (p->kind() == prim::Param || class_[p] == NodeClass::kNotCompilable)) {
        class_[n] = NodeClass::kNotCompilable;
        break;
      }
    }
  }
  Node* last_draw = nullptr;
  for (Node* n : graph_->nodes()) {
    if (class_[n] != NodeClass::kNotCompilable || !isRandomOp(n->kind())) continue;
    if (last_draw != nullptr) previous_draw_[n] = last_draw;
    last_draw = n;
  }
}

// A small node stays in the glue if every use is the graph's return or
// another such node, and every tensor it reads is a graph input, a value the
// graph returns anyway, or another such node's: dropping one that fails
// may fail its neighbours, so this repeats until nothing changes.
void GraphClusterer::keepSmallRootsInGlue() {
  static const auto small = c10::Symbol::attr(kSmallResultAttribute);
  Node* const ret = graph_->return_node();
  std::unordered_set<Node*> kept;
  for (Node* n : graph_->nodes()) {
    if (!n->hasAttribute(small)) continue;
    if (class_[n] == NodeClass::kCompute && n->outputs().size() == 1 && !isRandomOp(n->kind())) kept.insert(n);
    n->removeAttribute(small);
  }
  auto returned = [ret](const Value* v) {
    const auto& uses = v->uses();
    return std::any_of(uses.begin(), uses.end(), [ret](const torch::jit::Use& u) { return u.user == ret; });
  };
  // A tensor from outside any group; other values through plumbing (which
  // follows its consumer out of the group) from such tensors.
  std::function<bool(Value*)> readable = [&](Value* v) {
    Node* p = v->node();
    if (isTensor(v)) return p->kind() == prim::Param || returned(v) || kept.count(p) > 0;
    if (class_[p] != NodeClass::kPlumbing) return false;
    return std::all_of(p->inputs().begin(), p->inputs().end(), readable);
  };
  auto stays = [&](Node* n) {
    for (const torch::jit::Use& u : n->output()->uses()) {
      if (u.user != ret && !kept.count(u.user)) return false;
    }
    return isTensor(n->output()) && std::all_of(n->inputs().begin(), n->inputs().end(), readable);
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (Node* n : graph_->nodes()) {
      if (kept.count(n) && !stays(n)) {
        kept.erase(n);
        changed = true;
      }
    }
  }
  const bool other_compute = std::any_of(graph_->nodes().begin(), graph_->nodes().end(), [&](Node* n) {
    return class_[n] == NodeClass::kCompute && !kept.count(n);
  });
  if (!other_compute) return;  // nothing else to compile: the small roots are the group
  for (Node* n : kept) class_[n] = NodeClass::kNotCompilable;
}

// A detach or alias copy of a graph input is the input's value: its
// readers read the input. Such copies reach one graph only (a model moved
// to the lazy device, whose frozen weights' Parameter wrappers detached
// them, then settled at the first sync: pending_data.h), and a group
// reading one would differ from every later step's. A copy the graph
// returns stays there, in the glue.
void GraphClusterer::forwardCopiesOfInputs() {
  static const auto detach_copy = c10::Symbol::aten("detach_copy");
  static const auto alias_copy = c10::Symbol::aten("alias_copy");
  Node* const ret = graph_->return_node();
  for (auto it = graph_->nodes().begin(); it != graph_->nodes().end();) {
    Node* n = *it++;
    if ((n->kind() != detach_copy && n->kind() != alias_copy) || n->inputs().size() != 1 ||
        n->input()->node()->kind() != prim::Param) {
      continue;
    }
    const std::vector<torch::jit::Use> uses = n->output()->uses();
    for (const torch::jit::Use& u : uses) {
      if (u.user != ret) u.user->replaceInput(u.offset, n->input());
    }
    if (n->output()->uses().empty()) {
      n->destroy();
    } else {
      input_copies_.insert(n);
    }
  }
}

// What `n` must come after: the producers of its inputs and, for a random
// draw in the glue graph, the draw before it.
std::vector<Node*> GraphClusterer::predecessors(Node* n) const {
  std::vector<Node*> result;
  for (Value* v : n->inputs()) {
    if (v->node()->kind() != prim::Param) result.push_back(v->node());
  }
  auto draw = previous_draw_.find(n);
  if (draw != previous_draw_.end()) result.push_back(draw->second);
  return result;
}

// Each node's layer region (layer_regions.h). The lowering tags the node
// giving each LTC value; the helpers lowered with it (its constants, lists,
// the op under a multi-output node's ListUnpack) take their readers'
// lowest region, and no node sits below a producer's region, so that no path
// leaves a region and comes back. The tags are removed: a group's code must
// not depend on which layer it serves.
std::unordered_map<Node*, int64_t> GraphClusterer::takeRegions() {
  static const auto tag = c10::Symbol::attr(kRegionAttribute);
  std::unordered_map<Node*, int64_t> region;
  for (auto it = graph_->nodes().rbegin(); it != graph_->nodes().rend(); ++it) {
    Node* n = *it;
    if (n->hasAttribute(tag)) {
      region[n] = n->i(tag);
      n->removeAttribute(tag);
      continue;
    }
    int64_t r = INT64_MAX;
    for (Value* v : n->outputs()) {
      for (const torch::jit::Use& u : v->uses()) {
        auto found = region.find(u.user);
        if (found != region.end() && found->second >= 0) r = std::min(r, found->second);
      }
    }
    region[n] = r == INT64_MAX ? -1 : r;
  }
  for (Node* n : graph_->nodes()) {
    for (Node* p : predecessors(n)) region[n] = std::max(region[n], region[p]);
  }
  mergeRegionsAcrossScalars(region);
  return region;
}

// A value that is not a tensor (a size, a scalar) cannot cross a group's
// boundary: where a compilable node's such result is read in another
// region, the regions from its producer's to its reader's become one. The
// renumbering is monotone, so producers stay at or below their readers.
// Plumbing counts in its reader's region (it joins that group).
void GraphClusterer::mergeRegionsAcrossScalars(std::unordered_map<Node*, int64_t>& region) const {
  std::unordered_map<Node*, int64_t> joined;  // the region whose group a node joins
  for (auto it = graph_->nodes().rbegin(); it != graph_->nodes().rend(); ++it) {
    Node* n = *it;
    const bool follows = class_.at(n) == NodeClass::kPlumbing && n->outputs().size() == 1 && n->output()->hasUses();
    joined[n] = follows && joined.count(n->output()->uses()[0].user) ? joined[n->output()->uses()[0].user] : region[n];
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (Node* n : graph_->nodes()) {
    if (class_.at(n) == NodeClass::kNotCompilable) continue;
    for (Value* v : n->inputs()) {
      Node* p = v->node();
      if (isTensor(v) || p->kind() == prim::Param || class_.at(p) == NodeClass::kNotCompilable) continue;
      if (joined[p] != joined[n]) spans.emplace_back(std::min(joined[p], joined[n]), std::max(joined[p], joined[n]));
    }
  }
  if (spans.empty()) return;
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& span : spans) {
    if (!merged.empty() && span.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  for (auto& [node, r] : region) {
    auto after = std::upper_bound(merged.begin(), merged.end(), std::make_pair(r, INT64_MAX));
    if (after != merged.begin() && std::prev(after)->second >= r) r = std::prev(after)->first;
  }
}

// Moves each compilable node from the earliest depth its inputs allow to
// the latest its readers allow: the group of its first reader, or for a
// node read by a glue node, the last group before that node. Computed early,
// a value that is read only at the end (a checkpointed layer's recompute,
// whose inputs were ready in the forward) would be an output of a forward
// group, held across the step; a random draw in the glue (eager's masks)
// reads nothing computed, so the groups between draws merge into one after
// them. Glue nodes keep their depth, so the groups stay acyclic. A node the
// graph only returns joins the last group.
void GraphClusterer::placeLate(std::unordered_map<Node*, int>& depth) const {
  int last = 0;
  for (Node* n : graph_->nodes()) {
    if (class_.at(n) != NodeClass::kNotCompilable) last = std::max(last, depth[n]);
  }
  std::unordered_map<Node*, std::vector<Node*>> readers;
  for (Node* n : graph_->nodes()) {
    for (Node* p : predecessors(n)) readers[p].push_back(n);
  }
  for (auto it = graph_->nodes().rbegin(); it != graph_->nodes().rend(); ++it) {
    Node* n = *it;
    if (class_.at(n) == NodeClass::kNotCompilable) continue;
    int latest = last;
    for (Node* r : readers[n]) latest = std::min(latest, depth[r]);
    depth[n] = latest;
  }
}

void GraphClusterer::assignGroups(bool by_layer) {
  std::unordered_map<Node*, int64_t> region = takeRegions();
  // Barrier depth of every node, in topological (graph) order.
  std::unordered_map<Node*, int> depth;
  for (Node* n : graph_->nodes()) {
    int d = 0;
    for (Node* p : predecessors(n)) {
      d = std::max(d, depth[p] + (class_[p] == NodeClass::kNotCompilable ? 1 : 0));
    }
    depth[n] = d;
  }
  placeLate(depth);
  // Compute nodes join the group of their depth (and layer region);
  // plumbing (one use each after splitting) joins its consumer's group,
  // resolved from the end backwards.
  std::map<std::pair<int, int64_t>, int> group_of;
  for (Node* n : graph_->nodes()) {
    if (class_[n] != NodeClass::kCompute) continue;
    auto [it, added] = group_of.try_emplace({depth[n], by_layer ? region[n] : -1}, num_groups_);
    if (added) ++num_groups_;
    group_[n] = it->second;
  }
  for (auto it = graph_->nodes().rbegin(); it != graph_->nodes().rend(); ++it) {
    Node* n = *it;
    if (class_[n] != NodeClass::kPlumbing || n->outputs().size() != 1 || !n->output()->hasUses()) continue;
    auto consumer = group_.find(n->output()->uses()[0].user);
    if (consumer != group_.end()) group_[n] = consumer->second;
  }
}

// Reorders the block so that each group's nodes are contiguous: a
// topological sort of the graph with each group contracted to one unit,
// preferring the unit that appeared first in the original order.
void GraphClusterer::orderNodesByGroup() {
  std::vector<Node*> nodes(graph_->nodes().begin(), graph_->nodes().end());
  const int num_units = num_groups_ + static_cast<int>(nodes.size());
  auto unitOf = [&](Node* n, int index) {
    auto g = group_.find(n);
    return g != group_.end() ? g->second : num_groups_ + index;
  };
  std::unordered_map<Node*, int> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = static_cast<int>(i);

  std::vector<std::vector<Node*>> members(num_units);
  std::vector<int> first_seen(num_units, INT32_MAX), pending(num_units, 0);
  std::vector<std::vector<int>> successors(num_units);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int u = unitOf(nodes[i], static_cast<int>(i));
    members[u].push_back(nodes[i]);
    first_seen[u] = std::min(first_seen[u], static_cast<int>(i));
    for (Node* p : predecessors(nodes[i])) {
      const int pu = unitOf(p, index[p]);
      if (pu == u) continue;
      successors[pu].push_back(u);
      ++pending[u];
    }
  }
  using Entry = std::pair<int, int>;  // (first_seen, unit)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  for (int u = 0; u < num_units; ++u) {
    if (!members[u].empty() && pending[u] == 0) ready.push({first_seen[u], u});
  }
  Node* end = graph_->return_node();
  size_t placed = 0;
  while (!ready.empty()) {
    const int u = ready.top().second;
    ready.pop();
    for (Node* n : members[u]) {
      n->moveBefore(end);
      ++placed;
    }
    for (int s : successors[u]) {
      if (--pending[s] == 0) ready.push({first_seen[s], s});
    }
  }
  TORCH_INTERNAL_ASSERT(placed == nodes.size(), "lazy_mlir: fusion groups formed a cycle");
}

std::vector<Node*> GraphClusterer::buildGroups() {
  // Merge each contiguous run backwards, producer into consumer group.
  std::vector<Node*> groups;
  Node* group = nullptr;
  int current = -1;
  std::vector<Node*> nodes(graph_->nodes().begin(), graph_->nodes().end());
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    auto g = group_.find(n);
    if (g == group_.end()) {
      group = nullptr;
      continue;
    }
    if (group != nullptr && g->second == current) {
      SubgraphUtils::mergeNodeIntoSubgraph(n, group);
    } else {
      group = SubgraphUtils::createSingletonSubgraph(n, prim::FusionGroup);
      current = g->second;
      groups.push_back(group);
    }
  }
  std::reverse(groups.begin(), groups.end());
  for (Node* g : groups) {
    TORCH_INTERNAL_ASSERT(allTensors(g->inputs()) && allTensors(g->outputs()),
                          "lazy_mlir: fusion group with a non-tensor boundary");
  }
  return groups;
}

std::vector<Node*> GraphClusterer::run() {
  splitDropoutMasks(*graph_, [this](Node* n) { return classify_(n) == NodeClass::kNotCompilable; });
  forwardCopiesOfInputs();
  classifyNodes();
  keepSmallRootsInGlue();
  assignGroups(/*by_layer=*/!whole_graph_);
  if (num_groups_ == 0) return {};
  orderNodesByGroup();
  return buildGroups();
}

std::vector<Node*> GraphClusterer::runWholeGraph() {
  forwardCopiesOfInputs();
  classifyNodes();
  for (Node* n : graph_->nodes()) {
    if (class_[n] == NodeClass::kNotCompilable && !input_copies_.count(n)) {
      TORCH_CHECK(false, "lazy_mlir O2: ", n->kind().toQualString(), " cannot be compiled (",
                  describeSource(n), "); at O2 the whole step must compile. Use level=\"O1\" "
                  "to run such ops in TorchScript, or lazy_mlir.compilable.allow() the op.");
    }
  }
  whole_graph_ = true;  // one group, whatever the layers
  return run();  // with no barrier, every compute node has depth 0: one group
}

}  // namespace lazy_mlir
