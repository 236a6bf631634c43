// DeadDraws: eager PyTorch runs every random op it is given, used or not
// (the dropout of Canine's final character encoder, whose output no loss
// reads), and each run moves the generator on. LTC computes only what live
// tensors need: an unused draw never ran, and every later draw took the
// numbers it would have had, silently unlike eager.
//
// The Lazy kernels of random ops are wrapped to remember the nodes they
// build. When every live tensor is synced (mark_step, a read of a value
// that depends on draws), a remembered node that nothing else holds any more
// is a dead draw: it is synced with them, as a graph output dropped right
// after, and draw_order.h puts it in its place in trace order.
#pragma once

#include <torch/csrc/lazy/backend/backend_device.h>
#include <torch/csrc/lazy/core/tensor.h>

#include <vector>

namespace lazy_mlir {

// Wraps the Lazy kernels of draw_order.h's random ops (set by setRandomOps
// before) to remember their draws (once; later calls do nothing). The
// wrapper also keeps the step's draws for draw_stream.h.
void installDeadDraws();

// At a sync of every live tensor: appends to `tensors` a tensor for each
// dead draw traced since the last such sync, and forgets the others (they
// are in this sync's graph).
void addDeadDraws(std::vector<torch::lazy::LazyTensorPtr>* tensors, const torch::lazy::BackendDevice& device);

// A captured region's outputs that are draws nothing reads (a recorded
// forward's unused dropout or rand_like): a region is one node, whose live
// outputs keep it alive, so these are kept by output, not by node, and
// synced at the next sync of every live tensor like the kernels' dead draws
// (without it, the region's lowering drops the draw and every later draw
// takes other numbers than eager's).
void keepDeadDraws(const std::vector<at::Tensor>& outputs);

// A graph that runs random ops is executing: forgets every remembered draw.
// A draw it runs may be dead afterwards (a parameter initialised on the
// device, settled by a setup sync) and must not run again at the next live
// sync; a live sync took its dead draws before executing. A partial sync
// that draws (`.cpu()` mid-step, which warns that the step's draws then
// differ from eager's: syncs.on_execute) also drops the dead draws traced
// before it. RunStats counts the dead draws synced.
void forgetDraws();

}  // namespace lazy_mlir
