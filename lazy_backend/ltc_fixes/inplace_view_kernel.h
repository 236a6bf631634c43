// InplaceViewKernel: aten's own as_strided_ on the Lazy key.
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
#pragma once

namespace lazy_mlir {

// Registers it (before lazy_kernels.install() looks for ops without a Lazy
// kernel: it then leaves as_strided_ alone).
void registerInplaceViewKernel();

}  // namespace lazy_mlir
