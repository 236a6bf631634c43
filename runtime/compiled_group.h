// CompiledGroup: the executable of one fusion group, bound into the
// TorchScript glue graph as a constant and called by
// prim::CallMethod[name="run"](group, Tensor[]) -> Tensor[].
// The executable is a Python callable (list[Tensor]) -> list[Tensor]; run()
// takes the GIL, since the graph executor runs without it.
#pragma once

#include <torch/custom_class.h>

#include <atomic>
#include <string>

#include "python_callable.h"

namespace lazy_mlir {

class CompiledGroup : public torch::CustomClassHolder {
 public:
  CompiledGroup(std::string name, pybind11::object executable, int64_t num_outputs);

  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs);

  const std::string& name() const { return name_; }
  int64_t calls() const { return calls_.load(); }
  int64_t totalNs() const { return total_ns_.load(); }

 private:
  std::string name_;
  PythonCallable executable_;
  int64_t num_outputs_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> total_ns_{0};
};

// Registers the TorchScript class torch.classes.lazy_mlir.CompiledGroup.
void registerCompiledGroupClass();

}  // namespace lazy_mlir
