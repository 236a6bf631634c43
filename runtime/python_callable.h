// PythonCallable: a Python object held from C++ threads that do not own the
// GIL (LTC compiles and executes without it). Every call and the final
// release take the GIL.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace lazy_mlir {

class PythonCallable {
 public:
  PythonCallable() = default;
  explicit PythonCallable(pybind11::object fn);
  ~PythonCallable();
  PythonCallable(const PythonCallable&) = delete;
  PythonCallable& operator=(const PythonCallable&) = delete;

  bool defined() const { return fn_ != nullptr; }
  // Replaces the held object; call with or without the GIL.
  void reset(pybind11::object fn = pybind11::object());
  // Borrowed handle; only use it while holding the GIL.
  pybind11::handle get() const { return fn_; }

 private:
  PyObject* fn_ = nullptr;  // owned reference, released under the GIL
};

}  // namespace lazy_mlir
