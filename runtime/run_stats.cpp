#include "run_stats.h"

#include <chrono>

namespace lazy_mlir {

RunStats& RunStats::get() {
  static RunStats stats;
  return stats;
}

std::map<std::string, int64_t> RunStats::snapshot() const {
  return {
      {"compiles", compiles.load()},         {"compile_ns", compile_ns.load()},
      {"groups_built", groups_built.load()}, {"groups_rejected", groups_rejected.load()},
      {"executions", executions.load()},     {"execute_ns", execute_ns.load()},
      {"group_calls", group_calls.load()},   {"group_ns", group_ns.load()},
      {"native_calls", native_calls.load()}, {"native_ns", native_ns.load()},
      {"rebinds", rebinds.load()},
      {"group_outputs", group_outputs.load()}, {"group_output_bytes", group_output_bytes.load()},
      {"outputs_in_place", outputs_in_place.load()}, {"in_place_bytes", in_place_bytes.load()},
      {"donor_copies", donor_copies.load()},   {"donor_copy_bytes", donor_copy_bytes.load()},
      {"device_data_recycled", device_data_recycled.load()},
      {"step_memory_hits", step_memory_hits.load()}, {"step_memory_misses", step_memory_misses.load()},
      {"step_memory_evicted", step_memory_evicted.load()},
      {"step_memory_planned", step_memory_planned.load()},
      {"dead_draws_kept", dead_draws_kept.load()},
      {"draws_after_host_use", draws_after_host_use.load()},
  };
}

void RunStats::reset() {
  for (auto* c : {&compiles, &compile_ns, &groups_built, &groups_rejected, &executions,
                  &execute_ns, &group_calls, &group_ns, &native_calls, &native_ns, &rebinds, &group_outputs, &group_output_bytes,
                  &outputs_in_place, &in_place_bytes, &donor_copies, &donor_copy_bytes,
                  &device_data_recycled, &step_memory_hits, &step_memory_misses, &step_memory_evicted, &step_memory_planned,
                  &dead_draws_kept, &draws_after_host_use}) {
    c->store(0);
  }
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace lazy_mlir
