// BuiltinOpNode: an LTC IR node for an aten op the TorchScript backend has no
// lazy kernel for. It lowers to the TorchScript builtin of the same schema,
// so the op runs inside the traced graph with aten's own kernel instead of
// forcing an eager fallback (a graph execution) at every call.
//
// traceBuiltin() is its entry from Python: the Lazy-key kernel registered by
// lazy_mlir.trace.lazy_kernels gives the op, its arguments and the output shapes
// (from meta kernels) and gets lazy tensors back.
#pragma once

#include <torch/csrc/lazy/ts_backend/ts_node.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <optional>

namespace lazy_mlir {

class BuiltinOpNode : public torch::lazy::TsNode {
 public:
  // One entry per schema argument: a tensor operand, a list of optional
  // tensor operands (Tensor[] / Tensor?[]), or a constant.
  struct Argument {
    std::string name;
    bool kwarg_only = false;
    std::optional<size_t> operand;  // index into operands(), for a tensor
    std::optional<std::vector<std::optional<size_t>>> operand_list;  // for a tensor list
    c10::TypePtr list_type;         // Tensor[] or Tensor?[]
    c10::IValue constant;           // otherwise
  };

  // `list_sizes`: one entry per schema return, the number of tensors of a
  // Tensor[] return, or -1 for a single tensor (empty: all single tensors).
  // The node's outputs are the returns flattened: a list's items in order.
  BuiltinOpNode(c10::Symbol op, torch::lazy::OpList operands, std::vector<torch::lazy::Shape>&& shapes,
                std::vector<Argument> arguments, std::vector<int64_t> list_sizes, torch::lazy::hash_t hash);

  torch::lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                                torch::lazy::TSLoweringContext* loctx) const override;

  std::string ToString() const override;

 private:
  std::vector<Argument> arguments_;
  std::vector<int64_t> list_sizes_;
};

// Lowers one call of builtin `op` into `function`'s graph: `operand_value`
// gives the TorchScript value of each tensor operand index of `arguments`.
// Returns the call's outputs, Tensor[] returns flattened as for BuiltinOpNode.
torch::lazy::TSOpVector lowerBuiltinCall(const std::shared_ptr<torch::jit::GraphFunction>& function, c10::Symbol op,
                                         const std::vector<BuiltinOpNode::Argument>& arguments,
                                         const std::vector<int64_t>& list_sizes,
                                         const std::function<torch::jit::Value*(size_t)>& operand_value);

// A constant argument's part of a node's hash: its printed value, and
// doubles by their bits as well.
torch::lazy::hash_t hashConstant(const c10::IValue& constant);

// A constant argument's part of a node's hash, after `hash`: its name, then
// hashConstant. traceBuiltin hashes each constant so, and a C++ kernel that
// builds a BuiltinOpNode itself must too: equal calls, equal nodes.
torch::lazy::hash_t hashConstantArgument(torch::lazy::hash_t hash, const std::string& name,
                                         const c10::IValue& constant);

// The BuiltinOpNode of `op` on `operands`. `hash` starts from the qualified
// name and overload ("aten::sin.default") and takes each constant argument
// by hashConstantArgument, in schema order.
torch::lazy::NodePtr makeBuiltinNode(c10::Symbol op, const std::vector<torch::lazy::Value>& operands,
                                     std::vector<torch::lazy::Shape>&& shapes,
                                     std::vector<BuiltinOpNode::Argument>&& arguments,
                                     const std::vector<int64_t>& list_sizes, torch::lazy::hash_t hash);

// The schema of `name` ("aten::sin") and `overload` ("default" or e.g. "Tensor").
const c10::FunctionSchema& findSchema(const std::string& name, const std::string& overload);

// Traces `qualified_name` ("aten::sin", overload "default" or e.g. "Tensor")
// on lazy tensors (a functionalized one is read through its current
// value). `args` are the schema's arguments in order (defaults
// filled in); `outputs` are (dtype, sizes) pairs of the results, Tensor[]
// returns flattened (`list_sizes` as for BuiltinOpNode: an op returning
// tensor lists, e.g. _fused_adamw, is one node whose lowering unpacks them).
std::vector<at::Tensor> traceBuiltin(const std::string& qualified_name, const std::string& overload,
                                     const pybind11::list& args,
                                     const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& outputs,
                                     const std::vector<int64_t>& list_sizes);

// The BuiltinOpNode of `schema`'s op on `args`, one per schema argument as a
// boxed call carries them (tensors, tensor lists, constants), with its
// outputs' `shapes` (`list_sizes` as for BuiltinOpNode), and the device of
// its first lazy tensor argument (a factory's: of its lazy device argument,
// which the node holds as the backing device). traceBuiltin and BuiltinFront
// (kernel_fronts.h) both build through it: equal calls, equal hashes.
std::pair<torch::lazy::NodePtr, torch::lazy::BackendDevice> buildBuiltinNode(
    const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, std::vector<torch::lazy::Shape>&& shapes,
    const std::vector<int64_t>& list_sizes);

// traceBuiltin's node and the device it is on, without a lazy tensor per
// result (functional_update.h gives the results to tensors that exist).
std::pair<torch::lazy::NodePtr, torch::lazy::BackendDevice> traceBuiltinNode(
    const std::string& qualified_name, const std::string& overload, const pybind11::list& args,
    const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& outputs,
    const std::vector<int64_t>& list_sizes);

}  // namespace lazy_mlir
