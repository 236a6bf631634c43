// SourceLocations: what LTC records about every traced op, through its frame
// function (called when an IR node is created, in LTC's IR-debug mode):
// - the innermost Python frame of user code (skipping torch and lazy_mlir
//   internals), so that errors and warnings point at the line that created
//   the op; LTC's own frame function reports the outermost frame (e.g.
//   runpy's), which names no useful line;
// - the op's place in the trace order. LTC lowers a graph in post-order
//   from its outputs, which loses the order ops were traced in; random draws
//   need it (draw_order.h).
#pragma once

#include <torch/csrc/lazy/core/ir.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lazy_mlir {

// Installs the frame function; frames whose file starts with one of
// `internal_prefixes` are skipped. Without `record_frames` only the trace
// order is recorded (no Python frame walk per op).
void installSourceLocations(std::vector<std::string> internal_prefixes, bool record_frames);

// The user frame recorded for `node`, or nullptr.
const torch::lazy::SourceLocation* userFrame(const torch::lazy::Node* node);

// When `node` was traced: increasing over the process; -1 if not recorded
// (traced before installSourceLocations, or with IR-debug mode off).
int64_t traceOrder(const torch::lazy::Node* node);

// While one lives on this thread, nodes get their trace order but no user
// frame: device data, which no error names, is most of a step's nodes, and
// the frame walk was ~1 us each.
class WithoutUserFrames {
 public:
  WithoutUserFrames();
  ~WithoutUserFrames();
  WithoutUserFrames(const WithoutUserFrames&) = delete;
  WithoutUserFrames& operator=(const WithoutUserFrames&) = delete;
};

// How many IR nodes were built so far (every node built gets a trace order).
int64_t nodesBuilt();

}  // namespace lazy_mlir
