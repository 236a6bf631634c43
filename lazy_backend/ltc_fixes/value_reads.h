// ValueReads: `.item()` on a lazy tensor whose value is still pending and
// depends on random draws (a loss read between a dropout forward and
// mark_step) first syncs every live tensor, as mark_step does.
//
// LTC computes only the tensors a read asks for. Everything else that
// depends on the same draws (the masks and activations saved for backward,
// the gradients) would stay pending and draw again, other numbers, when the
// step's graph runs: the step would match neither the value read nor eager
// PyTorch. Synced together, they become data and the later graph reads them.
// A read whose graph draws nothing keeps LTC's partial sync (cheaper: no
// activation becomes an output).
//
// Only `_local_scalar_dense` (item(), float(t), bool(t)) has no Lazy kernel
// of LTC's own, so only it can be intercepted: other reads (`.cpu()`,
// printing) keep LTC's kernels, and the backend still warns when one of
// them runs random ops (syncs.on_execute). An op run eagerly on the host
// (lazy_kernels.eager_fallback: `unique` with `dim`) and a size read
// (data_dependent.py: masked_select's count) read their inputs the same
// way and call syncLiveTensorsBeforeRead first.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace torch::lazy {
class Node;
}

namespace lazy_mlir {

// Whether the graph computing `node` contains a random op (draw_order.h's
// kinds), inside recorded regions too.
bool dependsOnDraws(const torch::lazy::Node* node);

// True while a read syncs every live tensor (its executions redraw nothing).
bool syncingLiveTensorsForRead();

// Before `tensors` are read on the host: if one of them is pending and
// depends on draws, syncs every live tensor of its device; returns whether.
bool syncLiveTensorsBeforeRead(const std::vector<at::Tensor>& tensors);

// What a lazy tensor's value is computed from, as a key: its IR's hash and
// the data each device-data node reads, in post-order (a device-data node
// hashes by shape alone); for a tensor holding data, that data. While two
// tensors with equal keys are alive, they hold equal values (their data
// cannot be freed and reused). 0 when there is no such key: a value that
// depends on random draws (each draw differs), or host data.
uint64_t valueKey(const at::Tensor& tensor);

// Syncs every live tensor of `tensor`'s device, whatever it depends on: a
// planned read that cuts the step in two rather than recompute what it
// depends on (moe_experts: which experts got tokens, before the optimizer).
void syncLiveTensorsOf(const at::Tensor& tensor);

void registerValueReadKernels();

}  // namespace lazy_mlir
