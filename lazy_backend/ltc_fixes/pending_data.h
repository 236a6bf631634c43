// Live tensors whose pending value is data the device already holds.
//
// Three user patterns leave such a tensor at a sync:
//  - a CPU tensor moved with .to("lazy") and kept across steps (a fixed
//    batch, a mask): LTC uploads it at its first use but keeps it pending, a
//    device-data node with no data handle;
//  - `losses.append(loss.detach())` after mark_step: detach_copy of the
//    loss's device data;
//  - `loss.detach().cpu()` (or `.item()`) after mark_step: the same, read.
// A sync would make each a root of a graph: at mark_step, of that step's
// graph only (the first step would differ from every later one, a second
// compile of the whole step); at a read, a graph of its own executed for a
// copy. Such a tensor takes the device data as its own instead (the same
// buffer, no graph). Sharing a buffer is safe: LTC never writes one in
// place, and buffer donation skips a buffer that a live lazy tensor holds
// (buffer_donation.h).
#pragma once

#include <torch/csrc/lazy/core/tensor.h>

namespace lazy_mlir {

// If `tensor` has no data handle and its pending value is a device-data
// node, as is or through detach and alias copies, gives it that node's data
// and returns true. The backend's graph executor calls it for every tensor
// a sync collects (core/backend_graph_executor.h).
bool settlePendingData(const torch::lazy::LazyTensorPtr& tensor);

}  // namespace lazy_mlir
