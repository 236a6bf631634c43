// Live tensors whose pending value is data the device already holds.
//
// Two user patterns leave such a tensor at a sync:
//  - a CPU tensor moved with .to("lazy") and kept across steps (a fixed
//    batch, a mask): LTC uploads it at its first use but keeps it pending, a
//    device-data node with no data handle;
//  - `losses.append(loss.detach())` after mark_step: detach_copy of the
//    loss's device data.
// A sync would make each a root of the next graph, and of that graph only:
// the first step would differ from every later one (a second compile of
// the whole step). Such a tensor takes the device data as its own instead
// (the same buffer, no graph). Sharing a buffer is safe: LTC never writes
// one in place, and buffer donation skips a buffer that a live lazy tensor
// holds (buffer_donation.h).
#pragma once

#include <torch/csrc/lazy/core/tensor.h>

#include <vector>

namespace lazy_mlir {

// Gives each of `tensors` that has no data handle and whose pending value
// is a device-data node, as is or through detach and alias copies, that
// node's data.
void settlePendingData(const std::vector<torch::lazy::LazyTensorPtr>& tensors);

}  // namespace lazy_mlir
