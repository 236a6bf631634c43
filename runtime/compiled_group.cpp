#include "compiled_group.h"

#include "run_stats.h"

namespace lazy_mlir {

CompiledGroup::CompiledGroup(std::string name, pybind11::object executable, int64_t num_outputs)
    : name_(std::move(name)), executable_(std::move(executable)), num_outputs_(num_outputs) {}

std::vector<at::Tensor> CompiledGroup::run(std::vector<at::Tensor> inputs) {
  const int64_t start = nowNs();
  std::vector<at::Tensor> outputs;
  {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::object result = executable_.get()(pybind11::cast(std::move(inputs)));
      outputs = result.cast<std::vector<at::Tensor>>();
    } catch (pybind11::error_already_set& e) {
      TORCH_CHECK(false, "lazy_mlir: compiled group ", name_, " failed at run time: ", e.what());
    }
  }
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == num_outputs_, "lazy_mlir: compiled group ",
              name_, " returned ", outputs.size(), " tensors, expected ", num_outputs_);
  const int64_t elapsed = nowNs() - start;
  calls_.fetch_add(1);
  total_ns_.fetch_add(elapsed);
  RunStats::get().group_calls.fetch_add(1);
  RunStats::get().group_ns.fetch_add(elapsed);
  return outputs;
}

void registerCompiledGroupClass() {
  static bool done = false;
  if (done) return;
  done = true;
  static auto cls = torch::class_<CompiledGroup>("lazy_mlir", "CompiledGroup")
                        .def("run", &CompiledGroup::run)
                        .def("calls", &CompiledGroup::calls)
                        .def("total_ns", &CompiledGroup::totalNs);
}

}  // namespace lazy_mlir
