#include "python_callable.h"

namespace lazy_mlir {

PythonCallable::PythonCallable(pybind11::object fn) : fn_(fn.release().ptr()) {}

PythonCallable::~PythonCallable() { reset(); }

void PythonCallable::reset(pybind11::object fn) {
  if (fn_ == nullptr && !fn) return;
  if (!Py_IsInitialized()) {  // interpreter already gone at exit: leak instead of crash
    fn_ = fn ? fn.release().ptr() : nullptr;
    return;
  }
  pybind11::gil_scoped_acquire gil;
  Py_XDECREF(fn_);
  fn_ = fn ? fn.release().ptr() : nullptr;
}

}  // namespace lazy_mlir
