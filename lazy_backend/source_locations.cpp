#include "source_locations.h"

#include <torch/csrc/lazy/core/debug_util.h>
#include <torch/csrc/utils/pybind.h>

#include <frameobject.h>

#include <unordered_map>

namespace lazy_mlir {

namespace {

std::vector<std::string>& internalPrefixes() {
  static auto* prefixes = new std::vector<std::string>();
  return *prefixes;
}

bool isInternalFile(const std::string& file) {
  if (file.empty() || file[0] == '<') return true;  // <frozen runpy>, <string>, ...
  for (const auto& prefix : internalPrefixes()) {
    if (file.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

struct CodeInfo {
  bool internal;
  std::string file, function;
};

// Called for every traced op: remember what we need per code object (they
// live as long as their functions; only read and written under the GIL).
const CodeInfo& codeInfo(PyCodeObject* code) {
  static auto* known = new std::unordered_map<PyCodeObject*, CodeInfo>();
  auto it = known->find(code);
  if (it == known->end()) {
    std::string file = pybind11::cast<std::string>(pybind11::handle(code->co_filename));
    const bool internal = isInternalFile(file);
    it = known->emplace(code, CodeInfo{internal, std::move(file),
                                       pybind11::cast<std::string>(pybind11::handle(code->co_name))}).first;
  }
  return it->second;
}

std::vector<torch::lazy::SourceLocation> innermostUserFrame() {
  if (!Py_IsInitialized()) return {};
  pybind11::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::vector<torch::lazy::SourceLocation> result;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const CodeInfo& info = codeInfo(code);
    if (!info.internal) result.push_back({info.file, info.function, PyFrame_GetLineNumber(frame)});
    Py_DECREF(code);
    PyFrameObject* back = result.empty() ? PyFrame_GetBack(frame) : nullptr;
    Py_DECREF(frame);
    frame = back;
  }
  return result;
}

}  // namespace

void installSourceLocations(std::vector<std::string> internal_prefixes) {
  pybind11::gil_scoped_acquire gil;
  internalPrefixes() = std::move(internal_prefixes);
  torch::lazy::GetPythonFramesFunction() = innermostUserFrame;
}

}  // namespace lazy_mlir
