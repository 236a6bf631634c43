// What a captured module's record checks of its state at every call
// (python/lazy_mlir/capture.py), in C++ because it runs per call and per
// tensor or submodule:
// - StateSignature: what the record assumes of its parameters and buffers
//   besides their identity (dtype, sizes, requires_grad, device type:
//   `.data` assignment and `requires_grad_` change them in place), as one
//   bytes value for the record's key. In Python a tuple per tensor was
//   built, hashed and compared at every call: 130 us for 76 tensors (a CNN
//   with its BatchNorm buffers), 15 with this.
// - StateEntries: whether the module tree still holds what the last walk of
//   it found, so that the walk is skipped.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

namespace lazy_mlir {

// The signature of `tensors`, or None when one is not on the lazy device
// (the module then runs its original forward).
pybind11::object stateSignature(const std::vector<at::Tensor>& tensors);

// The dicts a walk of a module tree read (each submodule's _modules,
// _parameters and _buffers) with their lengths, and each (dict, key, value)
// entry it took. unchanged(): every dict has its length and every entry is
// still in place (the same object under its key), so the tree holds the
// same submodules, parameters and buffers. The same test was Python's
// map() over the lists: ~30 us a call on a small BERT, 2-3% of its step.
class StateEntries {
 public:
  // dicts: the dicts read; entries: (dict, key, value) tuples.
  StateEntries(const pybind11::list& dicts, const pybind11::list& entries);
  bool unchanged() const;

 private:
  struct Entry {
    pybind11::object dict, key, value;
  };
  std::vector<pybind11::object> dicts_;
  std::vector<Py_ssize_t> lengths_;
  std::vector<Entry> entries_;
};

}  // namespace lazy_mlir
