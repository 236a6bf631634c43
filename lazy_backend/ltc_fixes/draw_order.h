// DrawOrder: random ops that stay in the TorchScript glue graph (dropout's
// bernoulli, rand, ...) draw from the default generator when the graph runs,
// one after another in graph order. They draw the same numbers as eager
// PyTorch only if that order is the order they were traced in. LTC lowers a
// graph in post-order from its outputs instead, so two independent branches
// (an encoder's and a decoder's dropouts) could swap their draws: same
// distribution, other masks than eager's, silently. Here the lowering order
// and the clusterer keep random ops in trace order.
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/ir.h>

#include <string>
#include <vector>

namespace lazy_mlir {

// The op kinds that draw from a random generator ("aten::native_dropout", ...).
void setRandomOps(const std::vector<std::string>& kinds);
bool isRandomOp(c10::Symbol kind);

// `post_order` (a topological order of an LTC graph) reordered so that its
// random ops appear in trace order; every other node as early as LTC placed
// it, after its operands. Data nodes (graph parameters) keep their relative
// order and come first: LTC numbers the graph's parameters in that order.
// Returns an empty vector when `post_order` already draws in trace order or
// the trace order of a random op is unknown.
std::vector<const torch::lazy::Node*> inDrawOrder(c10::ArrayRef<const torch::lazy::Node*> post_order);

}  // namespace lazy_mlir
