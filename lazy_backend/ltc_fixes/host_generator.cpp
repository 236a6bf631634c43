#include "ltc_fixes/host_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/lazy/backend/backend_interface.h>

#include <cstring>
#include <mutex>
#include <optional>

namespace lazy_mlir {

namespace {

std::mutex g_mutex;
std::optional<at::Tensor> g_noted;  // the CPU generator's state at the first pending draw

bool drawsOnCpu() {
  return torch::lazy::hasBackend() && torch::lazy::getBackend()->EagerFallbackDeviceType() == c10::kCPU;
}

at::Tensor cpuGeneratorState() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();  // a copy: ~5 KB
}

}  // namespace

void noteDrawTraced() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_noted) return;
  }
  if (!drawsOnCpu()) return;
  at::Tensor state = cpuGeneratorState();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_noted) g_noted = std::move(state);
}

bool hostGeneratorMoved() {
  std::optional<at::Tensor> noted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    noted = g_noted;
  }
  if (!noted) return false;
  const at::Tensor now = cpuGeneratorState();
  return now.nbytes() != noted->nbytes() || std::memcmp(now.const_data_ptr(), noted->const_data_ptr(), now.nbytes()) != 0;
}

void forgetHostGenerator() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_noted.reset();
}

}  // namespace lazy_mlir
