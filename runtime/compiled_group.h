// CompiledGroup: the executable of one fusion group, bound into the
// TorchScript glue graph as a constant and called by
// prim::CallMethod[name="run"](group, Tensor[]) -> Tensor[].
// The executable is a Python callable (list[Tensor]) -> list[Tensor]; run()
// takes the GIL, since the graph executor runs without it. Where the
// executable's code offers a native entry that admits the inputs, run()
// calls that instead (native_entry.h).
// Inputs at donated positions may be overwritten by the executable (an
// output written into its buffer, buffer_donation.h): run() hands it only
// buffers that are dead after this execution, and a copy of any other.
#pragma once

#include <torch/custom_class.h>

#include <atomic>
#include <string>
#include <vector>

#include "native_entry.h"
#include "python_callable.h"

namespace lazy_mlir {

class CompiledGroup : public torch::CustomClassHolder {
 public:
  // `native`: where the executable offers its code to be called from C++
  // (native_entry.h); null if it does not.
  CompiledGroup(std::string name, pybind11::object executable, int64_t num_outputs,
                std::shared_ptr<NativeEntrySlot> native = nullptr);

  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs);

  // Input positions the executable may write an output into.
  void setDonated(std::vector<int64_t> positions) {
    donated_ = std::move(positions);
    donated_checked_ = false;
  }
  const std::vector<int64_t>& donated() const { return donated_; }

  const std::string& name() const { return name_; }
  int64_t calls() const { return calls_.load(); }
  int64_t totalNs() const { return total_ns_.load(); }

 private:
  std::string name_;
  PythonCallable executable_;
  std::shared_ptr<NativeEntrySlot> native_;
  int64_t num_outputs_;
  std::vector<int64_t> donated_;
  bool donated_checked_ = false;  // donated_ narrowed to the positions an output fits
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> total_ns_{0};
};

// Registers the TorchScript class torch.classes.lazy_mlir.CompiledGroup.
void registerCompiledGroupClass();

}  // namespace lazy_mlir
