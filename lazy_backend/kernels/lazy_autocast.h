// Autocast for lazy tensors: what torch.autocast("lazy") turns on
// (python/lazy_mlir/autocast.py).
//
// torch's autocast is a dispatch key per device (AutocastCPU, AutocastCUDA,
// ...) that a tensor carries by its backend; a lazy tensor carries none, and
// the CPU and CUDA autocast kernels cast only their own device's tensors. So
// a lazy model under torch.autocast("cpu") ran all in float32.
//
// Here: cast kernels on a key of our own, AutocastXLA (XLA's, unused by
// torch itself; torch_xla cannot share a process with our LTC backend). A
// lazy tensor does not carry that key either, so enabling autocast adds it
// to the thread's included dispatch keys (and takes it out of the excluded
// ones, where every autocast key starts): every op then passes through it,
// and the ops of the policy table get a boxed kernel that casts their lazy
// floating-point arguments by torch's policy for that op (lower precision,
// float32, float32 output dtype, widest type) and calls the op again with
// autocast excluded. Casts happen above autograd, as torch's: recorded, so
// the backward casts the gradients back. Other ops fall through.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <utility>
#include <vector>

namespace lazy_mlir {

// Registers the cast kernels once per process (a later call must bring the
// same table): (op name with overload, as "aten::softmax.int", policy)
// pairs; policies: "lower_precision_fp", "fp32", "fp32_set_opt_dtype",
// "fp32_append_dtype", "promote", "banned".
void registerLazyAutocast(const std::vector<std::pair<std::string, std::string>>& policies);

// This thread's state, as torch keeps its autocast state: per thread.
void setLazyAutocastEnabled(bool enabled);
bool lazyAutocastEnabled();
void setLazyAutocastDtype(c10::ScalarType dtype);
c10::ScalarType lazyAutocastDtype();
// The lower precision a thread starts with (bfloat16 behind a CPU, float16
// behind a GPU, as torch's own defaults for those devices).
void setLazyAutocastDefaultDtype(c10::ScalarType dtype);

}  // namespace lazy_mlir
