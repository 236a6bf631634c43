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
      {"rebinds", rebinds.load()},
  };
}

void RunStats::reset() {
  for (auto* c : {&compiles, &compile_ns, &groups_built, &groups_rejected, &executions,
                  &execute_ns, &group_calls, &group_ns, &rebinds}) {
    c->store(0);
  }
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace lazy_mlir
