// BatchNormKernel: the Lazy kernel of a training native_batch_norm that has
// running statistics.
//
// LTC traces native_batch_norm as one node whose IR leaves the running
// statistics untouched: they changed only because the TorchScript (or
// compiled) kernel wrote into its input buffers. So the update was lost
// when nothing read the node (a forward under no_grad whose output is
// dropped), applied twice when a read executed the node before mark_step
// executed it again, and read stale from LTC's host copy of a tensor synced
// before the step. This kernel traces the functional variant,
// _native_batch_norm_legit_functional, as one BuiltinOpNode and gives its
// new running statistics to the running-statistics tensors as their IR
// values: an update the graph computes like any other. Eval mode, and a
// call without running statistics, keep LTC's kernel.
//
// It was a Python kernel (lazy_kernels) first: 31 us a call against LTC's 6,
// on every BatchNorm layer of a CNN traced op by op, every step.
#pragma once

namespace lazy_mlir {

// Registers the kernel on the Lazy key, over LTC's (kept for eval mode).
void registerBatchNormKernel();

}  // namespace lazy_mlir
