// C++ fronts for two kinds of lazy_mlir's Python Lazy kernels
// (python/lazy_mlir/lazy_kernels.py), which a per-op trace calls on every
// step: a front is registered over the Python kernel and calls it only
// where the Python logic is needed.
//
// - BuiltinFront, over an op traced as one BuiltinOpNode (`where.self`,
//   `isneginf`, `all.dim`...): the Python kernel computes the output shapes
//   from meta kernels, with its special cases and its eager fallback. Once
//   it has built a node for a call signature (argument dtypes, sizes and
//   constants), the front builds that signature's later nodes itself, with
//   the shapes the node had (~16 us a call in Python, ~5 in C++).
// - CompositeFront, over an op run through its CompositeExplicitAutograd
//   kernel (`mul.Scalar`, `div.Scalar`, `_safe_softmax`...): once the Python
//   kernel has seen that kernel trace on the lazy device, the front
//   redispatches to it directly. Should a call fail there, the Python kernel
//   runs the call again and handles the failure (a refusal of the lazy
//   device, the user's error), and a refusal turns the direct path off.
#pragma once

#include <string>
#include <vector>

namespace lazy_mlir {

// Registers the fronts over the Python Lazy kernels now registered for these
// ops ("aten::where.self"); ops already fronted are skipped.
void frontBuiltinKernels(const std::vector<std::string>& qualified_names);
void frontCompositeKernels(const std::vector<std::string>& qualified_names);

// Whether CompositeFront redispatches `qualified_name` directly.
void setCompositeDirect(const std::string& qualified_name, bool direct);

// Whether this thread is inside a composite kernel that CompositeFront
// called directly (the Python kernel keeps its own count).
bool insideDirectComposite();

}  // namespace lazy_mlir
