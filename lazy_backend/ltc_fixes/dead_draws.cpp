#include "ltc_fixes/dead_draws.h"

#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/draw_stream.h"
#include "ltc_fixes/host_generator.h"
#include "runtime/run_stats.h"
#include "kernels/silent_warnings.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <mutex>
#include <string>

namespace lazy_mlir {

namespace {

std::mutex g_mutex;
std::vector<torch::lazy::NodePtr> g_draws;  // random nodes built since the last live sync, in trace order
std::vector<torch::lazy::Value> g_region_draws;  // captured regions' dead draws (keepDeadDraws)

void remember(const c10::IValue& value) {
  if (!value.isTensor()) return;
  auto tensor = torch::lazy::TryGetLtcTensor(value.toTensor());
  if (!tensor) return;
  torch::lazy::Value ir = tensor->CurrentIrValue();
  if (!ir || !isRandomOp(ir.node->op().op)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_draws.empty() || g_draws.back() != ir.node) g_draws.push_back(ir.node);  // native_dropout: two outputs
}

// Over a random op's Lazy kernel (LTC's): runs it, then puts the draw in
// the step's stream (draw_stream.h: a replayed draw takes the values drawn
// before) and remembers the node its outputs hold.
class DrawRecorder final : public c10::OperatorKernel {
 public:
  explicit DrawRecorder(c10::SafeKernelFunction kernel) : kernel_(std::move(kernel)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    kernel_.callBoxed(op, keys, stack);
    const size_t first_output = stack->size() - op.schema().returns().size();
    if (streamDraw(op, stack, first_output)) return;  // a replay takes the values drawn before
    noteDrawTraced();
    for (size_t i = first_output; i < stack->size(); ++i) remember((*stack)[i]);
  }

 private:
  c10::SafeKernelFunction kernel_;
};

// "aten::bernoulli_" draws as "aten::bernoulli" does.
bool drawsRandom(const c10::OperatorName& name) {
  std::string kind = name.name;
  if (!kind.empty() && kind.back() == '_') kind.pop_back();
  return isRandomOp(c10::Symbol::fromQualString(kind));
}

void wrapRandomKernels() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  SilentWarnings silent;  // replacing LTC's kernels is intended
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || !drawsRandom(name)) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::Lazy)) continue;
    std::string impl_name = name.name.substr(6);
    if (!name.overload_name.empty()) impl_name += "." + name.overload_name;
    auto recorder = std::make_unique<DrawRecorder>(op->getComputedKernelForDispatchKey(c10::DispatchKey::Lazy));
    library->impl(impl_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(recorder)));
  }
}

}  // namespace

void installDeadDraws() {
  static const bool wrapped = (wrapRandomKernels(), true);
  (void)wrapped;
}

void keepDeadDraws(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (at::Tensor output : outputs) {
    if (at::functionalization::impl::isFunctionalTensor(output)) {
      output = at::functionalization::impl::from_functional_tensor(output);
    }
    auto tensor = torch::lazy::TryGetLtcTensor(output);
    TORCH_CHECK(tensor, "lazy_mlir: a region's dead draw is not a lazy tensor");
    torch::lazy::Value ir = tensor->CurrentIrValue();
    if (ir) g_region_draws.push_back(std::move(ir));
  }
}

void addDeadDraws(std::vector<torch::lazy::LazyTensorPtr>* tensors, const torch::lazy::BackendDevice& device) {
  std::vector<torch::lazy::NodePtr> draws;
  std::vector<torch::lazy::Value> region_draws;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    draws.swap(g_draws);
    region_draws.swap(g_region_draws);
  }
  for (auto& value : region_draws) {  // nothing else holds these outputs: always dead
    tensors->push_back(torch::lazy::LazyTensor::Create(std::move(value), device));
    RunStats::get().dead_draws_kept++;
  }
  for (auto& node : draws) {
    if (node.use_count() != 1) continue;  // a live tensor's graph draws it
    tensors->push_back(torch::lazy::LazyTensor::Create(torch::lazy::Value(node, 0), device));
    RunStats::get().dead_draws_kept++;
  }
}

void forgetDraws() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_draws.clear();
  g_region_draws.clear();
}

}  // namespace lazy_mlir
