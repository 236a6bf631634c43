// MetaKernels: C++ Meta kernels for ops that LTC tracing runs on meta tensors
// at every traced op. Functionalization runs each in-place op a second time
// on meta tensors as a shape check, and converts tensors to meta with
// empty_like; once torch._decomp is imported, those ops' Meta kernels are
// Python refs (~0.1 ms a call): AdamW's addcdiv_/addcmul_/lerp_ alone cost
// ~24 ms of a 41 ms GPT-mini trace. The result of an in-place pointwise op
// is `self`; its kernel makes the same checks (operands broadcast to self's
// shape, result dtype castable to self's); empty_like gets aten's own.
#pragma once

#include <string>
#include <vector>

namespace lazy_mlir {

// Registers the in-place kernel on the Meta key for each op ("addcdiv_",
// "lerp_.Scalar"), and aten's empty_like.
void registerMetaKernels(const std::vector<std::string>& inplace_ops);

}  // namespace lazy_mlir
