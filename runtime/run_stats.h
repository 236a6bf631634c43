// RunStats: process-wide counters of what the backend did (compiles, graph
// executions, group calls and the time spent), read by lazy_mlir.metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace lazy_mlir {

struct RunStats {
  std::atomic<int64_t> compiles{0};          // computations given to Compile
  std::atomic<int64_t> compile_ns{0};        // wall time inside Compile
  std::atomic<int64_t> groups_built{0};      // fusion groups bound to executables
  std::atomic<int64_t> groups_rejected{0};   // groups left to TorchScript
  std::atomic<int64_t> executions{0};        // ExecuteComputation calls
  std::atomic<int64_t> execute_ns{0};        // wall time inside ExecuteComputation
  std::atomic<int64_t> group_calls{0};       // CompiledGroup::run calls
  std::atomic<int64_t> group_ns{0};          // wall time inside CompiledGroup::run
  std::atomic<int64_t> native_calls{0};      // of those, calls into the code from C++ (native_entry.h)
  std::atomic<int64_t> native_ns{0};         // wall time inside those calls
  std::atomic<int64_t> rebinds{0};           // computations lowered again for another parameter binding
  // Compiled groups' outputs, and those written into a donated input's
  // buffer (buffer_donation.h); donor candidates cloned first because their
  // buffer was still in use.
  std::atomic<int64_t> group_outputs{0};
  std::atomic<int64_t> group_output_bytes{0};
  std::atomic<int64_t> outputs_in_place{0};
  std::atomic<int64_t> in_place_bytes{0};
  std::atomic<int64_t> donor_copies{0};
  std::atomic<int64_t> donor_copy_bytes{0};
  // Device-data nodes handed out again by the pool (device_data_pool.h).
  std::atomic<int64_t> device_data_recycled{0};
  // Large CPU buffers of compiled groups (step_memory.h): taken from the
  // cache, allocated anew, freed to keep the cache under the peak.
  std::atomic<int64_t> step_memory_hits{0};
  std::atomic<int64_t> step_memory_misses{0};
  std::atomic<int64_t> step_memory_evicted{0};
  std::atomic<int64_t> step_memory_planned{0};
  // Random ops nothing used, run as eager would (dead_draws.h).
  std::atomic<int64_t> dead_draws_kept{0};
  // Graphs that drew after the host used the CPU generator mid-step (host_generator.h).
  std::atomic<int64_t> draws_after_host_use{0};

  static RunStats& get();
  std::map<std::string, int64_t> snapshot() const;
  void reset();
};

int64_t nowNs();

}  // namespace lazy_mlir
