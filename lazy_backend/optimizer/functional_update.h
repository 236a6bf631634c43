// In-place updates of many functionalized lazy tensors by one traced node
// (lazy_mlir.trace.fused_optimizer: an Adam step as one lazy_mlir::adam_step node
// over tensor lists): what functionalization's generated kernel of an
// in-place op does (replace, commit, sync, bump the version), from one call.
// (The generated kernels of list ops refuse an empty list among the mutated
// ones, e.g. _fused_adamw_'s max_exp_avg_sqs without amsgrad.)
#pragma once

#include <ATen/Tensor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

namespace lazy_mlir {

// The current value under each functionalized tensor (pending updates
// applied); a tensor that is not functionalized is returned as is.
std::vector<at::Tensor> functionalValues(const std::vector<at::Tensor>& tensors);

// targets[i] now holds values[i] (a lazy tensor of its shape and dtype), as
// after an in-place op: the update reaches the tensors aliasing it, and its
// autograd version counter is bumped.
void functionalReplace(const std::vector<at::Tensor>& targets, const std::vector<at::Tensor>& values);

// Below functionalization (a mutable op's Lazy kernel): `target`, a lazy
// tensor, now holds `value`'s lazy value (same sizes; cast to its dtype).
// LTC's copy_ refuses a target that holds synced device data and no IR:
// an in-place op whose functional sibling ran on the host with inputs that
// depend on random draws syncs every live tensor first (value_reads.h),
// its target too (BEiT's relative position bias gradient with dropout).
void writeLazy(const at::Tensor& target, const at::Tensor& value);

// traceBuiltin (builtin_op_node.h) of an op whose flattened results are the
// new values of `targets` (their shapes and dtypes), written as
// functionalReplace would: one call per optimizer step, no result tensor
// handed to Python. A target whose lazy tensor nothing else holds takes its
// result as a new IR value in that lazy tensor, not in a new one.
void traceUpdate(const std::string& qualified_name, const std::string& overload, const pybind11::list& args,
                 const std::vector<at::Tensor>& targets, const std::vector<int64_t>& list_sizes);

// Moves the lazy tensors traceUpdate wrote since the last call to the end of
// `tensors` (a sync's live tensors), in update order. LTC orders a sync's
// outputs by lazy tensor age, and that order is part of the graph's hash:
// a target updated in place keeps its age, and a first optimizer step,
// whose state is made during the step (younger than the loss, older in
// every later step), would trace another graph than the next. In this
// order every step lists them last, as the new tensors of the
// functionalized update were.
void orderUpdatedLast(std::vector<torch::lazy::LazyTensorPtr>& tensors);

}  // namespace lazy_mlir
