// What lazy_mlir.trace.steady_state needs below Python to settle parameters before
// a first training step, so that the step traces the steady-state graph.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

namespace lazy_mlir {

// The lazy tensors under the functionalization aliases of `tensors`
// (nn.Parameter detaches, so each parameter is an alias of the moved
// tensor), with their pending updates applied.
std::vector<at::Tensor> functionalBases(const std::vector<at::Tensor>& tensors);

// After a sync of the parameters and their bases: gives each parameter a
// data handle of its own on its base's buffer, as a step's sync leaves them
// (one output feeds both), so the next graph sees the same aliasing among its
// inputs as every later one. Returns how many were shared.
int64_t shareBaseBuffers(const std::vector<at::Tensor>& tensors);

// Makes each tensor that is the only alias of its functional storage a base
// of its own (its current value, no view of the moved tensor any more), so
// that an in-place update no longer writes the base and regenerates the view
// (a detach_copy node and a second graph output per parameter per step).
// Returns how many were made bases.
int64_t ownBuffers(const std::vector<at::Tensor>& tensors);

}  // namespace lazy_mlir
