// BackendGraphExecutor: the backend's LTC graph executor. LTC's, with the
// live tensors synced in functional_update.h's order with the step's dead
// draws (dead_draws.h), no graph for a tensor whose pending value is
// device data (pending_data.h), at mark_step as at a read, and the per-step
// resets at each mark_step (the draw stream, layer boundaries, the
// device-data pool, the step memory's per-step peak).
#pragma once

namespace lazy_mlir {

// Puts the backend's graph executor in place of LTC's (once; later calls do
// nothing).
void installGraphExecutor();

}  // namespace lazy_mlir
