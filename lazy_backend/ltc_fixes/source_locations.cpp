#include "ltc_fixes/source_locations.h"

#include <torch/csrc/lazy/core/debug_util.h>
#include <torch/csrc/utils/pybind.h>

#include <frameobject.h>

#include <atomic>
#include <unordered_map>

namespace lazy_mlir {

namespace {

// The trace order rides in frame_info as a last, synthetic entry: LTC gives
// a frame function no access to the node being created.
const char* const kTraceOrderFile = "<trace order>";

std::atomic<bool> g_record_frames{true};
std::atomic<int64_t> g_next_trace_order{0};
thread_local int g_without_user_frames = 0;

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
  std::unordered_map<int, int> lines;  // instruction offset -> line (PyFrame_GetLineNumber scans the code's table)
};

// Called for every traced op: remember what we need per code object. The
// code objects are kept alive (a freed one's address could name another);
// only read and written under the GIL.
CodeInfo& codeInfo(PyCodeObject* code) {
  static auto* known = new std::unordered_map<PyCodeObject*, CodeInfo>();
  auto it = known->find(code);
  if (it == known->end()) {
    std::string file = pybind11::cast<std::string>(pybind11::handle(code->co_filename));
    const bool internal = isInternalFile(file);
    Py_INCREF(code);
    it = known->emplace(code, CodeInfo{internal, std::move(file),
                                       pybind11::cast<std::string>(pybind11::handle(code->co_name)), {}}).first;
  }
  return it->second;
}

int lineNumber(CodeInfo& info, PyFrameObject* frame) {
  auto [it, added] = info.lines.try_emplace(PyFrame_GetLasti(frame), 0);
  if (added) it->second = PyFrame_GetLineNumber(frame);
  return it->second;
}

std::vector<torch::lazy::SourceLocation> innermostUserFrame() {
  if (!Py_IsInitialized()) return {};
  pybind11::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::vector<torch::lazy::SourceLocation> result;
  result.reserve(2);  // the user's frame and the trace order (traceMetadata)
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    CodeInfo& info = codeInfo(code);
    if (!info.internal) result.push_back({info.file, info.function, lineNumber(info, frame)});
    Py_DECREF(code);
    PyFrameObject* back = result.empty() ? PyFrame_GetBack(frame) : nullptr;
    Py_DECREF(frame);
    frame = back;
  }
  return result;
}

std::vector<torch::lazy::SourceLocation> traceMetadata() {
  std::vector<torch::lazy::SourceLocation> frames;
  if (g_record_frames.load(std::memory_order_relaxed) && g_without_user_frames == 0) frames = innermostUserFrame();
  frames.push_back({kTraceOrderFile, std::to_string(g_next_trace_order.fetch_add(1)), 0});
  return frames;
}

bool isTraceOrder(const torch::lazy::SourceLocation& frame) { return frame.file == kTraceOrderFile; }

}  // namespace

void installSourceLocations(std::vector<std::string> internal_prefixes, bool record_frames) {
  pybind11::gil_scoped_acquire gil;
  internalPrefixes() = std::move(internal_prefixes);
  g_record_frames = record_frames;
  torch::lazy::GetPythonFramesFunction() = traceMetadata;
}

WithoutUserFrames::WithoutUserFrames() { ++g_without_user_frames; }
WithoutUserFrames::~WithoutUserFrames() { --g_without_user_frames; }

const torch::lazy::SourceLocation* userFrame(const torch::lazy::Node* node) {
  const auto& frames = node->metadata().frame_info;
  if (frames.empty() || isTraceOrder(frames.front())) return nullptr;
  return &frames.front();
}

int64_t traceOrder(const torch::lazy::Node* node) {
  const auto& frames = node->metadata().frame_info;
  if (frames.empty() || !isTraceOrder(frames.back())) return -1;
  return std::stoll(frames.back().function);
}

int64_t nodesBuilt() { return g_next_trace_order.load(); }

}  // namespace lazy_mlir
