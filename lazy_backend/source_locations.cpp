#include "source_locations.h"

#include <torch/csrc/lazy/core/debug_util.h>
#include <torch/csrc/utils/pybind.h>

#include <frameobject.h>

namespace lazy_mlir {

namespace {

std::vector<std::string>& internalPrefixes() {
  static auto* prefixes = new std::vector<std::string>();
  return *prefixes;
}

bool isInternal(const std::string& file) {
  if (file.empty() || file[0] == '<') return true;  // <frozen runpy>, <string>, ...
  for (const auto& prefix : internalPrefixes()) {
    if (file.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

std::vector<torch::lazy::SourceLocation> innermostUserFrame() {
  if (!Py_IsInitialized()) return {};
  pybind11::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::vector<torch::lazy::SourceLocation> result;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    std::string file = pybind11::cast<std::string>(pybind11::handle(code->co_filename));
    if (!isInternal(file)) {
      result.push_back({file, pybind11::cast<std::string>(pybind11::handle(code->co_name)),
                        PyFrame_GetLineNumber(frame)});
    }
    Py_DECREF(code);
    PyFrameObject* back = result.empty() ? PyFrame_GetBack(frame) : nullptr;
    Py_DECREF(frame);
    frame = back;
  }
  return result;
}

}  // namespace

void installSourceLocations(std::vector<std::string> internal_prefixes) {
  internalPrefixes() = std::move(internal_prefixes);
  torch::lazy::GetPythonFramesFunction() = innermostUserFrame;
}

}  // namespace lazy_mlir
