// DeviceDataPool: device-data IR nodes recycled from step to step (the
// backend's IR builder, core/backend_ir_builder.h, makes its device-data
// nodes here).
//
// Every tensor a step writes (a parameter, its optimizer state, a batch-norm
// buffer) holds plain data after mark_step, and the next step that reads it
// makes a new device-data node for it: most of a captured step's nodes, the
// first operand of each region and optimizer node. The pool hands back a
// node of the same shape that nothing else holds any more (use count 1: no
// tensor, node or graph can see it), with the new data put in; its hash is
// its shape's, as a new node's. Slots are taken in the order the step asks
// for device data (from the first again after each mark_step), so a step
// like the last one finds its nodes in order. At each mark_step, once the
// step's graph has run and LTC's sync has let go of its nodes, the pooled
// nodes that nothing else holds let go of their data, so that no buffer a
// past step read stays alive between steps (the last step's parameters and
// optimizer state, replaced by its results). At the end of an execution
// the sync still holds the graph's nodes: a loop that only reads values
// with .cpu(), without mark_step, has them released at the start of its
// next execution.
#pragma once

#include <torch/csrc/lazy/backend/backend_data.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/core/ir_builder.h>

#include <memory>

namespace lazy_mlir {

// A device-data node for `data`: a pooled one when one of its shape is free,
// else `ts`'s new one (then pooled).
torch::lazy::NodePtr pooledDeviceData(const std::shared_ptr<torch::lazy::BackendData>& data,
                                      const torch::lazy::IrBuilder* ts);

// At a mark_step, after its sync: the next step's device data take the slots
// from the first; pooled nodes that nothing else holds release their data.
void devicePoolStepBoundary();

// Before a graph execution: pooled nodes that nothing else holds (those of
// earlier executions) release their data; nothing to do for the first
// execution after a mark_step, which released them.
void releasePooledData();

// Off: every device-data node is new (pooled nodes are dropped).
void setDeviceDataPool(bool on);

}  // namespace lazy_mlir
