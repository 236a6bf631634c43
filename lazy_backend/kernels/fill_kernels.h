// FillKernels: Lazy kernels for ones_like, zeros_like and full_like. They
// have no LTC kernel, and their composite (empty_like, then fill_) made a
// lazy tensor from a fresh eager allocation (LTC's empty) before fill_
// replaced its value, through two Python composite kernels: ~0.1 ms (under
// cProfile) for the seed of every backward() (autograd's ones_like of the
// loss). Here the
// result is the value fill_ would give, the scalar expanded to the shape,
// built directly. zero (torch.zeros, new_zeros) likewise, where LTC's node
// read the host-made empty tensor it zeroes; slice_backward and
// select_backward: zeros built so with the gradient scattered in (LTC's
// slice_scatter/select_scatter), where LTC's kernels ran torch._decomp's
// Python decomposition.
#pragma once

namespace lazy_mlir {

// Registers the kernels on the Lazy key (before lazy_kernels.install() looks
// for composite ops: it then leaves these alone).
void registerFillKernels();

}  // namespace lazy_mlir
