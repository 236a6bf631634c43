// DropoutMasks: a dropout runs in the TorchScript glue, where the random
// generator is eager's. LTC's
// aten::native_dropout reads the activation it drops, so each dropout in
// the glue cut the step's generated code in two: the groups before it,
// the groups after it, the activations crossing between them (a
// transformer: one cut per layer at least).
//
// Split here: only the mask is drawn in the glue, by
// lazy_mlir::dropout_mask, which runs native_dropout itself on an empty
// tensor of the activation's size and dtype (the same kernel on the same
// generator draws the same numbers: the mask does not depend on the
// values), and the compilable `x * mask * scale` takes the mask as an
// input. The mask reads nothing computed, so the groups around it merge
// (the clusterer places compute late: graph_clusterer.h).
//
// Sizes and dtype come from LTC's shapes at lowering (TorchScript graphs
// carry none): tagDropout puts them on the lowered node as attributes,
// splitDropoutMasks consumes them.
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/ir.h>

#include <functional>

namespace lazy_mlir {

// Tags a lowered aten::native_dropout with its activation's sizes and
// dtype (`shape`, its first output's) and the device the glue runs on; any
// other node is left alone. The first form takes the shape from an LTC
// native_dropout node; a captured region (region_node.h) records its own.
void tagDropout(const torch::lazy::Node& node, torch::jit::Node* lowered, c10::DeviceType glue_device);
void tagDropout(torch::jit::Node* lowered, const torch::lazy::Shape& shape, c10::DeviceType glue_device);

// Splits every tagged native_dropout that `in_glue` says stays in the glue
// (and runs in training mode) into a mask draw and its multiplication;
// removes the tags from the rest.
void splitDropoutMasks(torch::jit::Graph& graph, const std::function<bool(torch::jit::Node*)>& in_glue);

}  // namespace lazy_mlir
