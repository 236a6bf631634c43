// A Lazy kernel for _safe_softmax, the softmax of masked and causal
// scaled_dot_product_attention (its math path: the one a lazy tensor takes).
// aten's composite kernel ends in where.self_out, written into its softmax
// output: on the lazy device a Python kernel (lazy_kernels' mutable
// kernels: the functional where, then a copy into the argument), ~25 us of
// the ~55 a call took. This kernel calls the same ops with the functional
// where: the same values, and the same graph once the copy is traced.
#pragma once

namespace lazy_mlir {

// Registers the kernel on the Lazy key (before lazy_kernels.install() looks
// for composite ops: it then leaves _safe_softmax alone).
void registerSafeSoftmaxKernel();

}  // namespace lazy_mlir
