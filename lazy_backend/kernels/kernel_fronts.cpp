#include "kernels/kernel_fronts.h"

#include "nodes/builtin_op_node.h"
#include "kernels/silent_warnings.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/csrc/lazy/core/hash.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace lazy_mlir {

namespace {

using torch::lazy::Hash;
using torch::lazy::HashCombine;
using torch::lazy::hash_t;

thread_local int t_direct_composite_depth = 0;

// The library holding the fronts; it must outlive their registrations.
torch::Library& frontLibrary() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  return *library;
}

c10::OperatorHandle findOperator(const std::string& qualified_name) {
  const auto dot = qualified_name.find('.');
  const std::string name = qualified_name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified_name.substr(dot + 1);
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

// What a builtin op's output shapes may depend on in a tensor argument:
// dtype, sizes, and lazy or wrapped number (type promotion differs). None
// for anything the Python kernel must see (a functionalized tensor, a tensor
// on another device).
std::optional<hash_t> tensorSignature(const at::Tensor& tensor) {
  if (!tensor.defined()) return Hash(std::string("undefined"));
  if (at::functionalization::impl::isFunctionalTensor(tensor)) return std::nullopt;
  const bool lazy = tensor.device().type() == c10::DeviceType::Lazy;
  if (!lazy && !tensor.unsafeGetTensorImpl()->is_wrapped_number()) return std::nullopt;
  return HashCombine(HashCombine(Hash(static_cast<int64_t>(tensor.scalar_type())), Hash(tensor.sizes())), Hash(lazy));
}

// A call's arguments as far as output shapes go (constants by value, as the
// node hashes them); None for an argument of a kind not handled here
// (generators, symbolic sizes, complex numbers...).
std::optional<hash_t> callSignature(c10::ArrayRef<c10::IValue> args) {
  hash_t hash = Hash(static_cast<int64_t>(args.size()));
  for (const auto& arg : args) {
    if (arg.isTensor()) {
      auto tensor = tensorSignature(arg.toTensor());
      if (!tensor) return std::nullopt;
      hash = HashCombine(hash, *tensor);
    } else if (arg.isNone() || arg.isBool() || arg.isInt() || arg.isDouble() || arg.isString() || arg.isIntList() ||
               arg.isDoubleList() || arg.isBoolList() || arg.isDevice()) {
      hash = HashCombine(hash, hashConstant(arg));
    } else if (arg.isList()) {  // tensors, or optional tensors
      hash = HashCombine(hash, Hash(std::string("[")));
      for (const auto& item : arg.toListRef()) {
        if (item.isNone()) {
          hash = HashCombine(hash, Hash(std::string("None")));
          continue;
        }
        if (!item.isTensor()) return std::nullopt;
        // a boolean index's result size comes from its values: every call
        // goes to the Python kernel, which reads it (data_dependent.py)
        const auto dtype = item.toTensor().scalar_type();
        if (dtype == at::kBool || dtype == at::kByte) return std::nullopt;
        auto tensor = tensorSignature(item.toTensor());
        if (!tensor) return std::nullopt;
        hash = HashCombine(hash, *tensor);
      }
    } else {
      return std::nullopt;
    }
  }
  return hash;
}

struct NodeOutputs {
  std::vector<torch::lazy::Shape> shapes;
  std::vector<int64_t> list_sizes;  // as for BuiltinOpNode
};

// The shapes of the BuiltinOpNode of `schema`'s op that `outputs` (a call's
// returns) are the outputs of, in order; None if they are anything else (an
// eager fallback's results, another op's node).
std::optional<NodeOutputs> builtinNodeOutputs(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> outputs) {
  const torch::lazy::Node* node = nullptr;
  size_t next_index = 0;
  auto isNextOutput = [&](const c10::IValue& value) {
    if (!value.isTensor()) return false;
    auto lazy = torch::lazy::TryGetLtcTensor(value.toTensor());
    torch::lazy::Value ir = lazy ? lazy->CurrentIrValue() : torch::lazy::Value();
    if (!ir) return false;
    if (node == nullptr) node = ir.node.get();
    return ir.node.get() == node && ir.index == next_index++;
  };
  std::vector<int64_t> list_sizes;
  bool any_list = false;
  for (const auto& output : outputs) {
    if (output.isTensorList()) {
      any_list = true;
      list_sizes.push_back(static_cast<int64_t>(output.toListRef().size()));
      for (const auto& item : output.toListRef()) {
        if (!isNextOutput(item)) return std::nullopt;
      }
    } else {
      list_sizes.push_back(-1);
      if (!isNextOutput(output)) return std::nullopt;
    }
  }
  const auto* builtin = dynamic_cast<const BuiltinOpNode*>(node);
  if (builtin == nullptr || builtin->op().op != c10::Symbol::fromQualString(schema.name()) ||
      builtin->num_outputs() != next_index) {
    return std::nullopt;
  }
  if (!any_list) list_sizes.clear();
  return NodeOutputs{builtin->shapes().vec(), std::move(list_sizes)};
}

class BuiltinFront final : public c10::OperatorKernel {
 public:
  explicit BuiltinFront(c10::SafeKernelFunction python_kernel) : python_kernel_(std::move(python_kernel)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t num_args = schema.arguments().size();
    const std::optional<hash_t> signature = callSignature(torch::jit::last(*stack, num_args));
    if (signature) {
      std::optional<NodeOutputs> known;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = known_.find(*signature);
        if (found != known_.end()) known = found->second;
      }
      if (known && traceNode(schema, std::move(*known), stack)) return;
    }
    python_kernel_.callBoxed(op, keys, stack);
    if (!signature) return;
    if (auto outputs = builtinNodeOutputs(schema, torch::jit::last(*stack, schema.returns().size()))) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (known_.size() >= kMaxSignatures) known_.clear();  // the signatures of a training loop repeat
      known_.emplace(*signature, std::move(*outputs));
    }
  }

 private:
  static constexpr size_t kMaxSignatures = 4096;

  // The node, built as traceBuiltin builds it, its outputs in place of the
  // arguments on `stack`; false (stack untouched) if it could not be built.
  static bool traceNode(const c10::FunctionSchema& schema, NodeOutputs known, torch::jit::Stack* stack) {
    const size_t num_args = schema.arguments().size();
    torch::lazy::NodePtr node;
    torch::lazy::BackendDevice device;
    try {
      std::tie(node, device) =
          buildBuiltinNode(schema, torch::jit::last(*stack, num_args), std::move(known.shapes), known.list_sizes);
    } catch (const c10::Error&) {
      return false;  // the Python kernel then says what is wrong
    }
    torch::jit::drop(*stack, num_args);
    size_t index = 0;
    auto output = [&] {
      return torch::lazy::CreateAtenFromLtcTensor(
          torch::lazy::LazyTensor::Create(torch::lazy::Value(node, index++), device));
    };
    if (known.list_sizes.empty()) {
      for (size_t r = 0; r < schema.returns().size(); ++r) stack->emplace_back(output());
      return true;
    }
    for (int64_t size : known.list_sizes) {
      if (size < 0) {
        stack->emplace_back(output());
        continue;
      }
      c10::List<at::Tensor> items;
      for (int64_t i = 0; i < size; ++i) items.push_back(output());
      stack->emplace_back(std::move(items));
    }
    return true;
  }

  c10::SafeKernelFunction python_kernel_;
  std::mutex mutex_;
  std::unordered_map<hash_t, NodeOutputs, torch::lazy::HashReducer> known_;
};

class CompositeFront final : public c10::OperatorKernel {
 public:
  explicit CompositeFront(c10::SafeKernelFunction python_kernel) : python_kernel_(std::move(python_kernel)) {}

  void setDirect(bool direct) { direct_.store(direct, std::memory_order_relaxed); }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (direct_.load(std::memory_order_relaxed)) {
      const size_t num_args = op.schema().arguments().size();
      const size_t base = stack->size() - num_args;
      std::vector<c10::IValue> arguments(stack->begin() + base, stack->end());  // for the Python kernel's retry
      ++t_direct_composite_depth;
      try {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), stack);
        --t_direct_composite_depth;
        return;
      } catch (const std::exception&) {
        --t_direct_composite_depth;
        stack->resize(base);
        stack->insert(stack->end(), arguments.begin(), arguments.end());
      }
    }
    python_kernel_.callBoxed(op, keys, stack);
  }

 private:
  c10::SafeKernelFunction python_kernel_;
  std::atomic<bool> direct_{false};
};

std::mutex g_fronts_mutex;
std::unordered_set<std::string> g_fronted;
std::unordered_map<std::string, CompositeFront*> g_composite_fronts;  // owned by their registrations

template <class Front>
Front* registerFront(const std::string& qualified_name) {
  if (!g_fronted.insert(qualified_name).second) return nullptr;
  c10::OperatorHandle op = findOperator(qualified_name);
  auto front = std::make_unique<Front>(op.getComputedKernelForDispatchKey(c10::DispatchKey::Lazy));
  Front* raw = front.get();
  SilentWarnings silent;  // replacing the Python kernel is intended
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  const std::string name = qualified_name.substr(qualified_name.find("::") + 2);
  frontLibrary().impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(front)));
  return raw;
}

}  // namespace

void frontBuiltinKernels(const std::vector<std::string>& qualified_names) {
  std::lock_guard<std::mutex> lock(g_fronts_mutex);
  for (const auto& qualified_name : qualified_names) registerFront<BuiltinFront>(qualified_name);
}

void frontCompositeKernels(const std::vector<std::string>& qualified_names) {
  std::lock_guard<std::mutex> lock(g_fronts_mutex);
  for (const auto& qualified_name : qualified_names) {
    if (auto* front = registerFront<CompositeFront>(qualified_name)) g_composite_fronts[qualified_name] = front;
  }
}

void setCompositeDirect(const std::string& qualified_name, bool direct) {
  std::lock_guard<std::mutex> lock(g_fronts_mutex);
  auto found = g_composite_fronts.find(qualified_name);
  if (found != g_composite_fronts.end()) found->second->setDirect(direct);
}

bool insideDirectComposite() { return t_direct_composite_depth > 0; }

}  // namespace lazy_mlir
