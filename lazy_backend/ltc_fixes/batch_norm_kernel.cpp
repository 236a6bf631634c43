#include "ltc_fixes/batch_norm_kernel.h"

#include "nodes/builtin_op_node.h"
#include "kernels/silent_warnings.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_native_batch_norm_legit.h>  // and its functional variant
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/lazy/core/hash.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace lazy_mlir {

namespace {

constexpr const char* kFunctional = "aten::_native_batch_norm_legit_functional";

// LTC's own kernel, taken before ours replaced it: eval mode runs it.
std::unique_ptr<c10::SafeKernelFunction> g_ltc_kernel;

// A tensor's dtype and sizes, or "undefined", for the shape cache's key.
torch::lazy::hash_t signatureOf(const std::optional<at::Tensor>& t) {
  if (!t || !t->defined()) return torch::lazy::Hash(std::string("undefined"));
  return torch::lazy::HashCombine(torch::lazy::Hash(static_cast<int64_t>(t->scalar_type())),
                                  torch::lazy::Hash(t->sizes()));
}

std::optional<at::Tensor> metaOf(const std::optional<at::Tensor>& t) {
  if (!t || !t->defined()) return std::nullopt;
  return at::empty(t->sizes(), t->options().device(at::kMeta));
}

// The functional op's five outputs, from its meta kernel (what trace_builtin
// takes for any op), computed once per dtypes and sizes.
std::vector<torch::lazy::Shape> outputShapes(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                                             const at::Tensor& running_var) {
  static std::mutex mutex;
  static std::unordered_map<torch::lazy::hash_t, std::vector<torch::lazy::Shape>, torch::lazy::HashReducer> known;
  torch::lazy::hash_t key = signatureOf(input);
  for (const auto& t : {weight, bias, std::optional<at::Tensor>(running_mean), std::optional<at::Tensor>(running_var)}) {
    key = torch::lazy::HashCombine(key, signatureOf(t));
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = known.find(key);
    if (found != known.end()) return found->second;
  }
  auto [out, save_mean, save_invstd, new_mean, new_var] = at::_native_batch_norm_legit_functional(
      *metaOf(input), metaOf(weight), metaOf(bias), *metaOf(running_mean), *metaOf(running_var), true, 0.1, 1e-5);
  std::vector<torch::lazy::Shape> shapes;
  for (const auto& t : {out, save_mean, save_invstd, new_mean, new_var}) shapes.emplace_back(t.scalar_type(), t.sizes());
  std::lock_guard<std::mutex> lock(mutex);
  known.emplace(key, shapes);
  return shapes;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ltcNativeBatchNorm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  torch::jit::Stack stack{input, weight, bias, running_mean, running_var, training, momentum, eps};
  g_ltc_kernel->callBoxed(g_ltc_kernel->opHandle(), c10::DispatchKeySet(c10::DispatchKey::Lazy), &stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> nativeBatchNorm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  const bool has_stats = running_mean && running_mean->defined() && running_var && running_var->defined();
  torch::lazy::LazyTensorPtr lazy_input = torch::lazy::TryGetLtcTensor(input);
  if (!training || !has_stats || !lazy_input) {  // nothing written (or not ours to trace)
    return ltcNativeBatchNorm(input, weight, bias, running_mean, running_var, training, momentum, eps);
  }
  const torch::lazy::BackendDevice device = lazy_input->GetDevice();
  const torch::lazy::LazyTensorPtr lazy_mean = torch::lazy::TryGetLtcTensor(*running_mean);
  const torch::lazy::LazyTensorPtr lazy_var = torch::lazy::TryGetLtcTensor(*running_var);
  TORCH_CHECK(lazy_mean && lazy_var, "lazy_mlir: native_batch_norm's running statistics are not lazy tensors (",
              running_mean->device(), ")");

  // The node, argument by argument as trace_builtin builds it from the
  // functional op's schema: tensors as operands, the rest as constants.
  std::vector<torch::lazy::Value> operands;
  std::vector<BuiltinOpNode::Argument> arguments;
  torch::lazy::hash_t hash = torch::lazy::Hash(std::string(kFunctional) + ".default");
  auto addTensor = [&](const char* name, const std::optional<at::Tensor>& t) {
    BuiltinOpNode::Argument a{name, false, std::nullopt, {}};
    if (t && t->defined()) {
      operands.push_back(torch::lazy::GetLtcTensorOrCreateForWrappedNumber(*t, device)->GetIrValue());
      a.operand = operands.size() - 1;
    } else {
      hash = hashConstantArgument(hash, name, a.constant);  // None
    }
    arguments.push_back(std::move(a));
  };
  auto addConstant = [&](const char* name, c10::IValue value) {
    hash = hashConstantArgument(hash, name, value);
    arguments.push_back(BuiltinOpNode::Argument{name, false, std::nullopt, {}, nullptr, std::move(value)});
  };
  addTensor("input", input);
  addTensor("weight", weight);
  addTensor("bias", bias);
  addTensor("running_mean", running_mean);
  addTensor("running_var", running_var);
  addConstant("training", true);
  addConstant("momentum", momentum);
  addConstant("eps", eps);
  torch::lazy::NodePtr node =
      makeBuiltinNode(c10::Symbol::fromQualString(kFunctional), operands,
                      outputShapes(input, weight, bias, *running_mean, *running_var), std::move(arguments), {}, hash);

  lazy_mean->SetInPlaceIrValue(torch::lazy::Value(node, 3));
  lazy_var->SetInPlaceIrValue(torch::lazy::Value(node, 4));
  auto result = [&](size_t index) {
    return torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(torch::lazy::Value(node, index), device));
  };
  return {result(0), result(1), result(2)};
}

}  // namespace

void registerBatchNormKernel() {
  static const bool registered = [] {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_batch_norm", "");
    g_ltc_kernel = std::make_unique<c10::SafeKernelFunction>(op.getComputedKernelForDispatchKey(c10::DispatchKey::Lazy));
    // The library must outlive its registration: kept for the process.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    SilentWarnings silent;  // replacing LTC's kernel is intended
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    library->impl("native_batch_norm", TORCH_FN(nativeBatchNorm));
    return true;
  }();
  (void)registered;
}

}  // namespace lazy_mlir
