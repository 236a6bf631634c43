#include "core/group_binder.h"

#include <torch/csrc/jit/passes/utils/subgraph_utils.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "runtime/compiled_group.h"
#include "runtime/run_stats.h"
#include "memory/buffer_donation.h"
#include "core/python_hooks.h"

namespace lazy_mlir {

using torch::jit::Node;
using torch::jit::Value;
namespace prim = torch::jit::prim;

namespace {

Value* insertObjectConstant(torch::jit::Graph& graph, const c10::IValue& object) {
  Node* n = graph.create(prim::Constant);
  n->ival_(torch::jit::attr::value, object);
  n->output()->setType(object.type());
  return graph.insertNode(n)->output();
}

}  // namespace

bool GroupBinder::bind(Node* group, int index) {
  const std::string name = graph_name_ + ".g" + std::to_string(index);
  auto subgraph = group->g(torch::jit::attr::Subgraph);
  const std::vector<int64_t> candidates = BufferDonation::groupCandidates(group);
  std::vector<int64_t> donated;
  pybind11::object executable;
  std::shared_ptr<NativeEntrySlot> native;  // where its code may be offered to C++ (native_entry.h)
  {
    pybind11::gil_scoped_acquire gil;
    try {
      executable = PythonHooks::get().compile_group.get()(subgraph, name);
    } catch (pybind11::error_already_set& e) {
      // The Python side reports its own failures and returns None; this is a bug there.
      PyErr_WarnEx(PyExc_RuntimeWarning,
                   ("lazy_mlir: compiling " + name + " raised: " + e.what()).c_str(), 1);
      executable = pybind11::none();
    }
    if (executable.is_none()) {
      executable = pybind11::object();  // release under the GIL
    } else if (pybind11::hasattr(executable, "native")) {  // a GroupExecutable's
      native = executable.attr("native").cast<std::shared_ptr<NativeEntrySlot>>();
    }
    if (executable && !candidates.empty() && pybind11::hasattr(executable, "offer_donation")) {
      // The inputs the executable's code may write an output into (buffer_donation.h).
      try {
        donated = executable.attr("offer_donation")(candidates).cast<std::vector<int64_t>>();
      } catch (pybind11::error_already_set& e) {  // a bug there: run without donations
        PyErr_WarnEx(PyExc_RuntimeWarning, ("lazy_mlir: offering " + name + " donations raised: " + e.what()).c_str(),
                     1);
        donated.clear();
      }
    }
  }
  if (!executable) {
    torch::jit::SubgraphUtils::unmergeSubgraph(group);
    RunStats::get().groups_rejected.fetch_add(1);
    return false;
  }

  auto& graph = *group->owningGraph();
  torch::jit::WithInsertPoint guard(group);
  const auto num_outputs = static_cast<int64_t>(group->outputs().size());
  auto holder = c10::make_intrusive<CompiledGroup>(name, std::move(executable), num_outputs, std::move(native));
  any_donated_ = any_donated_ || !donated.empty();
  holder->setDonated(std::move(donated));
  Value* self = insertObjectConstant(graph, c10::IValue(std::move(holder)));
  Value* inputs = graph.insertNode(graph.createList(c10::TensorType::get(), group->inputs()))->output();
  Node* call = graph.insertNode(graph.create(prim::CallMethod, {self, inputs}));
  call->s_(torch::jit::attr::name, "run");
  call->output()->setType(c10::ListType::ofTensors());
  Node* unpack = graph.insertNode(graph.createListUnpack(call->output(), num_outputs));
  for (int64_t i = 0; i < num_outputs; ++i) {
    unpack->output(i)->setType(group->output(i)->type());
    group->output(i)->replaceAllUsesWith(unpack->output(i));
  }
  group->destroy();
  RunStats::get().groups_built.fetch_add(1);
  return true;
}

}  // namespace lazy_mlir
