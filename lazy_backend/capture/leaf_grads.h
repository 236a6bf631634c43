// LeafGrads: the gradients a captured replay's backward computes for
// parameters, stored into `.grad` directly instead of through the autograd
// engine's AccumulateGrad. AccumulateGrad stores a fresh gradient as
// `grad.detach()`, which on the lazy device is a functionalized view op
// (~6 us, and a detach node per parameter in the step's graph). Where it would
// do nothing else (no gradient yet, no hooks, a plain backward() without
// create_graph: the caller checks that), the result is the same tensor
// without the view.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace lazy_mlir {

// For each i where leaves[i] is a leaf tensor and grads[i] its gradient,
// sets leaves[i].grad = grads[i] and returns None in its place when
// AccumulateGrad would store exactly that; every other gradient is returned
// as is for the engine to accumulate. Call from a backward() only, and not
// in a backward(create_graph=True): AccumulateGrad then stores a clone.
std::vector<std::optional<at::Tensor>> storeLeafGrads(const std::vector<std::optional<at::Tensor>>& leaves,
                                                      std::vector<std::optional<at::Tensor>> grads);

}  // namespace lazy_mlir
