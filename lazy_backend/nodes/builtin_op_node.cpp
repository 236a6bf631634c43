#include "nodes/builtin_op_node.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/lazy/backend/backend_device.h>
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <torch/csrc/lazy/ts_backend/ts_node_lowering.h>

#include <sstream>

namespace lazy_mlir {

BuiltinOpNode::BuiltinOpNode(c10::Symbol op, torch::lazy::OpList operands,
                             std::vector<torch::lazy::Shape>&& shapes, std::vector<Argument> arguments,
                             std::vector<int64_t> list_sizes, torch::lazy::hash_t hash)
    : TsNode(torch::lazy::OpKind(op), operands, std::move(shapes), /*num_outputs=*/shapes.size(), hash),
      arguments_(std::move(arguments)),
      list_sizes_(std::move(list_sizes)) {}

torch::lazy::TSOpVector BuiltinOpNode::Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                                             torch::lazy::TSLoweringContext* loctx) const {
  return lowerBuiltinCall(function, op().op, arguments_, list_sizes_,
                          [&](size_t index) { return loctx->GetOutputOp(operand(index)); });
}

torch::lazy::TSOpVector lowerBuiltinCall(const std::shared_ptr<torch::jit::GraphFunction>& function, c10::Symbol op,
                                         const std::vector<BuiltinOpNode::Argument>& arguments,
                                         const std::vector<int64_t>& list_sizes,
                                         const std::function<torch::jit::Value*(size_t)>& operand_value) {
  auto& graph = *function->graph();
  std::vector<torch::jit::NamedValue> args, kwargs;
  for (const auto& a : arguments) {
    torch::jit::NamedValue value(a.constant);
    if (a.operand) {
      value = torch::jit::NamedValue(operand_value(*a.operand));
    } else if (a.operand_list) {
      std::vector<torch::jit::Value*> items;
      for (const auto& index : *a.operand_list) {
        items.push_back(index ? operand_value(*index) : graph.insertConstant(c10::IValue()));
      }
      auto elem = a.list_type->expectRef<c10::ListType>().getElementType();
      value = torch::jit::NamedValue(graph.insertNode(graph.createList(elem, items))->output());
    }
    if (a.kwarg_only) {
      kwargs.emplace_back(a.name, value.value(graph));
    } else {
      args.push_back(std::move(value));
    }
  }
  auto returns = torch::lazy::LowerTSBuiltin(function, op, args, kwargs);
  if (list_sizes.empty()) return returns;
  TORCH_CHECK(returns.size() == list_sizes.size(), "lazy_mlir: ", op.toQualString(), " lowered to ",
              returns.size(), " values, expected ", list_sizes.size());
  // The builtin call packs several returns into a tuple, unused here: a
  // list-typed value must not reach the glue graph (groups exchange tensors).
  for (const auto& use : returns[0]->uses()) {
    auto* tuple = use.user;
    if (tuple->kind() == c10::prim::TupleConstruct && !tuple->output()->hasUses()) {
      tuple->destroy();
      break;
    }
  }
  torch::lazy::TSOpVector flat;  // a Tensor[] return contributes its items
  for (size_t r = 0; r < returns.size(); ++r) {
    if (list_sizes[r] < 0) {
      flat.push_back(returns[r]);
    } else if (list_sizes[r] > 0) {
      auto* unpack = graph.insertNode(graph.createListUnpack(returns[r], list_sizes[r]));
      for (auto* v : unpack->outputs()) flat.push_back(v);
    }
  }
  return flat;
}

std::string BuiltinOpNode::ToString() const {
  std::ostringstream ss;
  ss << TsNode::ToString();
  for (const auto& a : arguments_) {
    if (!a.operand) ss << ", " << a.name << "=" << a.constant;
  }
  return ss.str();
}

torch::lazy::hash_t hashConstant(const c10::IValue& constant) {
  // Numbers, flags and strings by value and kind (1 and 1.0 and true differ):
  // an optimizer's node hashes a dozen every step, and printing a double
  // was a tenth of its trace. Doubles by their bits: -0.0 is not 0.0
  // (hardtanh(x, -0.0, 5) must not run the 0.0 graph).
  using torch::lazy::Hash;
  using torch::lazy::HashCombine;
  if (constant.isNone()) return Hash(std::string("None"));
  if (constant.isBool()) return HashCombine(Hash(std::string("bool")), Hash(constant.toBool()));
  if (constant.isInt()) return HashCombine(Hash(std::string("int")), Hash(constant.toInt()));
  if (constant.isDouble()) return HashCombine(Hash(std::string("float")), Hash(constant.toDouble()));
  if (constant.isString()) return HashCombine(Hash(std::string("str")), Hash(constant.toStringRef()));
  if (constant.isIntList()) return HashCombine(Hash(std::string("int[]")), Hash(constant.toIntVector()));
  // the rest (devices, lists of other kinds, ...) by what they print
  std::ostringstream repr;
  repr << constant;
  torch::lazy::hash_t hash = Hash(repr.str());
  if (constant.isDoubleList()) {
    for (double item : constant.toDoubleVector()) hash = HashCombine(hash, Hash(item));
  }
  return hash;
}

namespace {

// A functionalized tensor's current value (its pending updates applied), so
// that callers can pass the tensors they update as they are; else `tensor`.
at::Tensor unwrapped(const at::Tensor& tensor) {
  if (!at::functionalization::impl::isFunctionalTensor(tensor)) return tensor;
  at::functionalization::impl::sync(tensor);
  return at::functionalization::impl::from_functional_tensor(tensor);
}

// A lazy device argument names the device behind it: the TorchScript graph
// runs there (a factory made on the lazy device inside it would be lazy).
c10::IValue onBackingDevice(const c10::IValue& value, const torch::lazy::BackendDevice& device) {
  if (!value.isDevice() || value.toDevice().type() != c10::kLazy) return value;
  const c10::DeviceType backing = torch::lazy::getBackend()->EagerFallbackDeviceType();
  return c10::Device(backing, backing == c10::kCPU ? -1 : static_cast<c10::DeviceIndex>(device.ordinal()));
}

// Tensor[] or Tensor?[]: its tensors are the node's operands.
bool isTensorList(const c10::Argument& formal) {
  return formal.type()->isSubtypeOf(*c10::ListType::ofOptionalTensors()) ||
         formal.type()->isSubtypeOf(*c10::ListType::ofTensors());
}

}  // namespace

const c10::FunctionSchema& findSchema(const std::string& name, const std::string& overload) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
  TORCH_CHECK(handle.has_value(), "lazy_mlir: no operator ", name, ".", overload);
  return handle->schema();
}

std::pair<torch::lazy::NodePtr, torch::lazy::BackendDevice> buildBuiltinNode(
    const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, std::vector<torch::lazy::Shape>&& shapes,
    const std::vector<int64_t>& list_sizes) {
  const std::string& qualified_name = schema.name();
  TORCH_CHECK(args.size() == schema.arguments().size(), "lazy_mlir: ", qualified_name, " expects ",
              schema.arguments().size(), " arguments, got ", args.size());

  // The device comes from the first lazy tensor argument (or tensor list item).
  std::optional<torch::lazy::BackendDevice> device;
  auto findDevice = [&](const c10::IValue& arg) {
    if (!device && arg.isTensor()) {
      if (auto lt = torch::lazy::TryGetLtcTensor(arg.toTensor())) device = lt->GetDevice();
    }
  };
  for (const auto& arg : args) {
    if (arg.isList()) {
      for (const auto& item : arg.toListRef()) findDevice(item);
    } else {
      findDevice(arg);
    }
    if (device) break;
  }
  // A factory (randperm) has no tensor argument: its device argument says which.
  for (size_t i = 0; i < args.size() && !device; ++i) {
    if (args[i].isDevice() && args[i].toDevice().type() == c10::kLazy) {
      device = torch::lazy::atenDeviceToBackendDevice(args[i].toDevice());
    }
  }
  TORCH_CHECK(device, "lazy_mlir: ", qualified_name, " called without a lazy tensor or device argument");

  std::vector<torch::lazy::Value> operand_values;
  std::vector<BuiltinOpNode::Argument> arguments;
  const std::string& overload = schema.overload_name();
  torch::lazy::hash_t hash = torch::lazy::Hash(qualified_name + "." + (overload.empty() ? "default" : overload));
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& formal = schema.arguments()[i];
    BuiltinOpNode::Argument a{formal.name(), formal.kwarg_only(), std::nullopt, {}};
    const c10::IValue& value = args[i];
    auto addOperand = [&](const at::Tensor& tensor) {
      // Wrapped numbers and CPU scalars become device data, like LTC's own kernels do.
      auto lt = torch::lazy::GetLtcTensorOrCreateForWrappedNumber(tensor, *device);
      operand_values.push_back(lt->GetIrValue());
      return operand_values.size() - 1;
    };
    if (value.isTensor()) {
      a.operand = addOperand(value.toTensor());
    } else if (isTensorList(formal) && value.isList()) {
      a.operand_list.emplace();
      a.list_type = formal.type();
      std::string pattern;  // which entries are None is part of the op's identity
      for (const auto& item : value.toListRef()) {
        a.operand_list->push_back(item.isNone() ? std::nullopt : std::optional<size_t>(addOperand(item.toTensor())));
        pattern += item.isNone() ? 'N' : 'T';
      }
      hash = torch::lazy::HashCombine(hash, torch::lazy::Hash(formal.name() + "=[" + pattern + "]"));
    } else {
      a.constant = onBackingDevice(value, *device);
      hash = hashConstantArgument(hash, formal.name(), a.constant);
    }
    arguments.push_back(std::move(a));
  }
  const size_t num_outputs = shapes.size();
  if (!list_sizes.empty()) {
    TORCH_CHECK(list_sizes.size() == schema.returns().size(), "lazy_mlir: ", qualified_name, " has ",
                schema.returns().size(), " returns, got ", list_sizes.size(), " list sizes");
    int64_t flat = 0;
    for (int64_t n : list_sizes) flat += n < 0 ? 1 : n;
    TORCH_CHECK(flat == static_cast<int64_t>(num_outputs), "lazy_mlir: ", qualified_name, ": list sizes give ",
                flat, " outputs, got ", num_outputs, " shapes");
  }
  return {makeBuiltinNode(c10::Symbol::fromQualString(qualified_name), operand_values, std::move(shapes),
                          std::move(arguments), list_sizes, hash),
          *device};
}

std::pair<torch::lazy::NodePtr, torch::lazy::BackendDevice> traceBuiltinNode(
    const std::string& qualified_name, const std::string& overload, const pybind11::list& args,
    const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& outputs,
    const std::vector<int64_t>& list_sizes) {
  const auto& schema = findSchema(qualified_name, overload);
  TORCH_CHECK(args.size() == schema.arguments().size(), "lazy_mlir: ", qualified_name, " expects ",
              schema.arguments().size(), " arguments, got ", args.size());
  // The arguments as the dispatcher's boxed calls carry them (what
  // BuiltinFront, kernel_fronts.h, passes): equal calls, equal nodes.
  std::vector<c10::IValue> values;
  values.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& formal = schema.arguments()[i];
    pybind11::handle value = args[i];
    if (THPVariable_Check(value.ptr())) {
      values.emplace_back(unwrapped(THPVariable_Unpack(value.ptr())));
    } else if (isTensorList(formal) && !value.is_none()) {
      c10::List<std::optional<at::Tensor>> items;
      for (auto item : value) {
        items.push_back(item.is_none() ? std::nullopt
                                       : std::optional<at::Tensor>(unwrapped(THPVariable_Unpack(item.ptr()))));
      }
      values.emplace_back(std::move(items));
    } else {
      values.push_back(torch::jit::toIValue(value, formal.type()));
    }
  }
  std::vector<torch::lazy::Shape> shapes;
  for (const auto& [dtype, sizes] : outputs) shapes.emplace_back(dtype, sizes);
  return buildBuiltinNode(schema, values, std::move(shapes), list_sizes);
}

torch::lazy::NodePtr makeBuiltinNode(c10::Symbol op, const std::vector<torch::lazy::Value>& operands,
                                     std::vector<torch::lazy::Shape>&& shapes,
                                     std::vector<BuiltinOpNode::Argument>&& arguments,
                                     const std::vector<int64_t>& list_sizes, torch::lazy::hash_t hash) {
  return torch::lazy::MakeNode<BuiltinOpNode>(op, operands, std::move(shapes), std::move(arguments), list_sizes,
                                              hash);
}

torch::lazy::hash_t hashConstantArgument(torch::lazy::hash_t hash, const std::string& name,
                                         const c10::IValue& constant) {
  return torch::lazy::HashCombine(torch::lazy::HashCombine(hash, torch::lazy::Hash(name)), hashConstant(constant));
}

std::vector<at::Tensor> traceBuiltin(const std::string& qualified_name, const std::string& overload,
                                     const pybind11::list& args,
                                     const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& outputs,
                                     const std::vector<int64_t>& list_sizes) {
  auto [node, device] = traceBuiltinNode(qualified_name, overload, args, outputs, list_sizes);
  std::vector<at::Tensor> results;
  for (size_t i = 0; i < outputs.size(); ++i) {
    results.push_back(torch::lazy::CreateAtenFromLtcTensor(
        torch::lazy::LazyTensor::Create(torch::lazy::Value(node, i), device)));
  }
  return results;
}

}  // namespace lazy_mlir
