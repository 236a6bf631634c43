// LayerRegions: where a model's repeated layers (the blocks of a ModuleList)
// start and end in the trace, so that no fusion group spans two of them.
//
// A step is one graph, and its backward, with no random op to cut it, one
// fusion group: a model that skips layers at random (LayerDrop: M2M100,
// Wav2Vec2, HuBERT, WavLM) traced another graph at each skip pattern, and
// that whole group compiled again (M2M100: 15 s a pattern). With a group
// per layer, every layer's group is the same code (same ops, same sizes):
// it compiles once and serves every layer at every pattern, and a deep
// model's cold compile is one layer's.
//
// Python (lazy_mlir.cluster.layer_groups) marks a boundary when a layer's forward
// starts and ends, and when its output's and its input's gradients are
// computed. A node's region is the number of boundaries marked before it
// was traced; the lowering tags the TorchScript nodes with it and the
// clusterer groups only nodes of one region. Data flows forward in the
// trace, so a consumer's region is never below its producers': the groups
// stay acyclic.
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/ir.h>

#include <cstdint>

namespace lazy_mlir {

// The node attribute carrying the region (set by the lowering, removed by
// the clusterer).
constexpr const char* kRegionAttribute = "layer_region";

// A boundary before the next traced node.
void markLayerBoundary();

// Forgets the boundaries (at mark_step: the next step's nodes start over).
void clearLayerBoundaries();

// The region of `node`, or -1 when no boundary is marked or the node's
// trace order is unknown.
int64_t layerRegion(const torch::lazy::Node* node);

}  // namespace lazy_mlir
