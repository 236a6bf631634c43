#include "kernels/lazy_autocast.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <optional>
#include <unordered_map>

namespace lazy_mlir {

namespace {

constexpr c10::DispatchKey kLazyAutocastKey = c10::DispatchKey::AutocastXLA;

enum class Policy { LowerPrecision, Fp32, Fp32SetOptDtype, Fp32AppendDtype, Promote, Banned };

Policy parsePolicy(const std::string& name) {
  static const std::unordered_map<std::string, Policy> names = {
      {"lower_precision_fp", Policy::LowerPrecision}, {"fp32", Policy::Fp32},
      {"fp32_set_opt_dtype", Policy::Fp32SetOptDtype}, {"fp32_append_dtype", Policy::Fp32AppendDtype},
      {"promote", Policy::Promote}, {"banned", Policy::Banned}};
  auto it = names.find(name);
  TORCH_CHECK(it != names.end(), "lazy autocast: unknown cast policy '", name, "'");
  return it->second;
}

// Written once at registration (init(), under the GIL), before any kernel runs; read-only after.
std::unordered_map<c10::OperatorName, Policy>& policies() {
  static std::unordered_map<c10::OperatorName, Policy> table;
  return table;
}

c10::ScalarType g_default_dtype = at::kBFloat16;
thread_local std::optional<c10::ScalarType> t_dtype;

// torch's eligibility, for the lazy device: floating point, not float64.
bool eligible(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::Lazy && t.is_floating_point() &&
      t.scalar_type() != at::kDouble;
}

at::Tensor castTo(const at::Tensor& t, c10::ScalarType to) {
  return eligible(t) && t.scalar_type() != to ? t.to(to) : t;
}

template <typename Visit>
void forEachTensor(const c10::IValue& value, Visit&& visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) visit(t);
  }
}

void castArguments(torch::jit::Stack& stack, size_t first, c10::ScalarType to) {
  for (size_t i = first; i < stack.size(); ++i) {
    c10::IValue& value = stack[i];
    if (value.isTensor()) {
      value = castTo(value.toTensor(), to);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> cast;
      for (const at::Tensor& t : value.toTensorList()) cast.push_back(castTo(t, to));
      value = std::move(cast);
    }
  }
}

// The widest floating type among the lazy arguments: float32 over the lower
// precision; float64 arguments are left alone (torch's prioritize()).
c10::ScalarType promoteType(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first) {
  const c10::ScalarType lower = lazyAutocastDtype();
  c10::ScalarType current = lower;
  for (size_t i = first; i < stack.size(); ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t) {
      if (!eligible(t)) return;
      const c10::ScalarType next = t.scalar_type();
      if (current == at::kFloat || next == at::kFloat) {
        current = at::kFloat;
      } else {
        TORCH_CHECK(next == lower, "torch.autocast(\"lazy\", dtype=", lower, "): ", op.operator_name(),
                    " has a ", next, " argument; autocast mixes only float32 and ", lower);
      }
    });
  }
  return current;
}

bool firstArgumentEligible(const torch::jit::Stack& stack, size_t first) {
  return first < stack.size() && stack[first].isTensor() && eligible(stack[first].toTensor());
}

// fp32_set_opt_dtype: an unset `ScalarType? dtype` argument becomes float32.
void setOptionalDtype(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first) {
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "dtype" && stack[first + i].isNone()) {
      stack[first + i] = c10::IValue(static_cast<int64_t>(at::kFloat));
    }
  }
}

// fp32_append_dtype: norm's overloads without a dtype, redispatched to the
// ones with one (the only ops torch gives this policy).
c10::OperatorHandle overloadWithDtype(const c10::OperatorName& name) {
  static const std::unordered_map<std::string, std::string> with_dtype = {
      {"Scalar", "ScalarOpt_dtype"}, {"ScalarOpt_dim", "ScalarOpt_dim_dtype"}};
  auto it = with_dtype.find(name.overload_name);
  TORCH_CHECK(name.name == "aten::norm" && it != with_dtype.end(), "lazy autocast: no dtype overload for ", name);
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.name.c_str(), it->second.c_str());
}

void castKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t first = stack->size() - schema.arguments().size();
  const Policy policy = policies().at(op.operator_name());
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  switch (policy) {
    case Policy::LowerPrecision:
      castArguments(*stack, first, lazyAutocastDtype());
      break;
    case Policy::Fp32:
      castArguments(*stack, first, at::kFloat);
      break;
    case Policy::Promote:
      castArguments(*stack, first, promoteType(op, *stack, first));
      break;
    case Policy::Fp32SetOptDtype:
      if (firstArgumentEligible(*stack, first)) setOptionalDtype(schema, *stack, first);
      break;
    case Policy::Fp32AppendDtype: {
      const at::Tensor& self = (*stack)[first].toTensor();
      const c10::ScalarType out = eligible(self) ? at::kFloat : self.scalar_type();
      stack->emplace_back(static_cast<int64_t>(out));
      overloadWithDtype(op.operator_name()).callBoxed(stack);
      return;
    }
    case Policy::Banned:
      if (firstArgumentEligible(*stack, first)) {
        TORCH_CHECK(false, op.operator_name(), " is unsafe to autocast (torch refuses it on CUDA): ",
                    "use binary_cross_entropy_with_logits (BCEWithLogitsLoss) on the logits instead.");
      }
      break;
  }
  op.callBoxed(stack);
}

}  // namespace

void registerLazyAutocast(const std::vector<std::pair<std::string, std::string>>& table) {
  std::unordered_map<c10::OperatorName, Policy> parsed;
  for (const auto& [qualified, policy] : table) {
    const auto dot = qualified.find('.');
    parsed.emplace(c10::OperatorName(qualified.substr(0, dot), dot == std::string::npos ? "" : qualified.substr(dot + 1)),
                   parsePolicy(policy));
  }
  if (!policies().empty()) {  // init() again: the kernels are registered once per process
    TORCH_CHECK(parsed == policies(), "lazy autocast: registered already, with another policy table");
    return;
  }
  policies() = std::move(parsed);
  // The libraries must outlive their registrations: kept for the process.
  auto* fallthrough = new torch::Library(torch::Library::IMPL, "_", kLazyAutocastKey, __FILE__, __LINE__);
  fallthrough->fallback(torch::CppFunction::makeFallthrough());
  auto* kernels = new torch::Library(torch::Library::IMPL, "aten", kLazyAutocastKey, __FILE__, __LINE__);
  for (const auto& [qualified, policy] : table) {
    kernels->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&castKernel>());
  }
}

void setLazyAutocastEnabled(bool enabled) {
  c10::impl::tls_set_dispatch_key_included(kLazyAutocastKey, enabled);
  c10::impl::tls_set_dispatch_key_excluded(kLazyAutocastKey, !enabled);
}

bool lazyAutocastEnabled() {
  return c10::impl::tls_is_dispatch_key_included(kLazyAutocastKey) &&
      !c10::impl::tls_is_dispatch_key_excluded(kLazyAutocastKey);
}

void setLazyAutocastDtype(c10::ScalarType dtype) { t_dtype = dtype; }

c10::ScalarType lazyAutocastDtype() { return t_dtype.value_or(g_default_dtype); }

void setLazyAutocastDefaultDtype(c10::ScalarType dtype) { g_default_dtype = dtype; }

}  // namespace lazy_mlir
