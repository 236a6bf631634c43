// StateSignature: what a captured module's record assumes of its parameters
// and buffers besides their identity (dtype, sizes, requires_grad, device
// type: `.data` assignment and `requires_grad_` change them in place), as
// one bytes value for the record's key (python/lazy_mlir/capture.py). In
// Python a tuple per tensor was built, hashed and compared at every call:
// 130 us for 76 tensors (a CNN with its BatchNorm buffers), 15 with this.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

namespace lazy_mlir {

// The signature of `tensors`, or None when one is not on the lazy device
// (the module then runs its original forward).
pybind11::object stateSignature(const std::vector<at::Tensor>& tensors);

}  // namespace lazy_mlir
