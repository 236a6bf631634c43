// BackendIrBuilder: the IR builder LTC asks the backend for
// (LazyMlirBackend::GetIrBuilder). TorchScript's, with device-data nodes
// recycled by device_data_pool.h and a read-only scalar given data of its
// own (one graph input per node, whatever the values).
#pragma once

#include <torch/csrc/lazy/core/ir_builder.h>

namespace lazy_mlir {

// The IR builder of the backend, over `ts` (TorchScript's).
const torch::lazy::IrBuilder* backendIrBuilder(const torch::lazy::IrBuilder* ts);

}  // namespace lazy_mlir
