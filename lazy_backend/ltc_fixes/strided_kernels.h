// StridedKernels: Lazy kernels of the two factory and view ops that take
// explicit strides, where LTC's (or none) got them wrong.
//
// as_strided_ changes a tensor's sizes and strides, no value. Its kernel is
// CompositeExplicitAutogradNonFunctional, which every backend gets but the
// functionalized ones (Lazy, XLA): functionalization turns the op into a
// view of the base before it reaches them. AOTAutograd's functionalization
// (a captured forward's record) applies such an op to its wrapper tensor by
// calling it on the wrapper itself, with Python dispatch off, so the op
// reached the Lazy key with a tensor that holds no LTC data: LTC's fallback
// asserted ("lazy_self"), and the record failed (adaptive_avg_pool2d on a
// channels-last tensor: torchvision's ConvNeXt and Swin). The kernel sets
// the tensor's metadata, as on every other backend. An LTC tensor (no
// storage to set strides over: aten's kernel crashed on it) is refused as a
// resize is, so that a composite kernel calling it is traced another way.
//
// empty_strided: LTC's made an empty tensor of the sizes' element count and
// viewed it with the strides. Strides with gaps (those of a slice of a
// bigger tensor) then reached past its end: TorchScript refused the view
// ("out of bounds for storage") and Inductor's code read and wrote past the
// buffer. AOTAutograd makes such a tensor at every backward of a captured
// forward that returns a slice (a sliding-window cache's keys: Mistral,
// Starcoder2), to give the incoming gradient the output's strides. Here the
// empty tensor spans every element the strides reach, as eager allocates.
#pragma once

namespace lazy_mlir {

// Registers them (before lazy_kernels.install() looks for ops without a
// Lazy kernel: it then leaves them alone).
void registerStridedKernels();

}  // namespace lazy_mlir
