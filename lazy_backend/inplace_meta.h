// InplaceMeta: a C++ Meta kernel for in-place pointwise ops (addcdiv_,
// lerp_, mul_, ...). Functionalization runs every in-place op a second time
// on meta tensors as a shape check; once torch._decomp is imported, those
// ops' Meta kernels are Python refs (~0.1 ms a call): AdamW's
// addcdiv_/addcmul_/lerp_ alone cost ~24 ms of a 41 ms GPT-mini trace. The
// result of such an op is `self`; this kernel makes the same checks
// (operands broadcast to self's shape, result dtype castable to self's).
#pragma once

#include <string>
#include <vector>

namespace lazy_mlir {

// Registers the kernel on the Meta key for each op ("addcdiv_", "lerp_.Scalar").
void registerInplaceMeta(const std::vector<std::string>& ops);

}  // namespace lazy_mlir
