// StepMemory: the large CPU buffers a compiled group allocates, kept for the
// next step instead of going back to the system.
//
// A training step allocates the same buffers every step (activations,
// gradients, the optimizer's temporaries), most of them above glibc's mmap
// threshold or at the top of its heap: freed, glibc unmaps or trims them,
// and the next step touches fresh pages, a page fault per 4 KiB (zoo ResNet
// at the base size: ~1,000 faults and ~2.5 ms of a 16.8 ms step). This
// allocator wraps the CPU allocator: a buffer of at least kMinBytes
// allocated while a compiled group runs (StepMemoryScope, on that thread)
// goes, once freed, to a free list of its exact size, and the next request
// for that size inside a group takes it. Everything else is the wrapped
// allocator's, untouched (eager code in the same process keeps glibc's
// behaviour).
//
// Bound: the buffers held (live + cached) stay under twice the most bytes
// the groups' own buffers were ever live at once: a miss first frees the
// least recently freed blocks until the request fits. While a step's sizes
// repeat, the cache holds what the last step freed and every request hits;
// the slack is used only when sizes change (another batch shape) and the
// free lists hold blocks nothing asks for. Those go after 16 group calls
// unasked, and release() empties the cache (a group got new code: new
// sizes are likely).
//
// ideep (oneDNN's convolutions) allocates through raw_allocate, which wants
// the context to be the data pointer: every block here is its own context,
// and the deleter finds it in a table.
#pragma once

#include <c10/core/Allocator.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <map>
#include <string>

namespace lazy_mlir {

// While alive, this thread's large CPU allocations come from (and go back
// to) StepMemory, if it is installed and on.
class StepMemoryScope {
 public:
  StepMemoryScope();
  ~StepMemoryScope();
  StepMemoryScope(const StepMemoryScope&) = delete;
  StepMemoryScope& operator=(const StepMemoryScope&) = delete;

 private:
  bool outer_;
};

// Installs the wrapper as the CPU allocator (once per process) and turns the
// cache on or off (off: blocks are given back as they are freed).
void setStepMemory(bool on);
// Frees every cached block; the peak restarts from what is live.
void releaseStepMemory();
// cached_bytes, live_bytes, peak_bytes (the most bytes live at once since the
// process began or the last release: the cache's bound is twice it),
// last_step_peak_bytes (stepMemoryStepEnded's) and group_calls (scopes
// opened; the counts of hits, misses and evicted blocks are RunStats').
std::map<std::string, int64_t> stepMemoryStats();

// At mark_step: last_step_peak_bytes becomes the ending step's peak above
// the bytes live when it began (its activations and temporaries, not the
// state that lives on in such buffers).
void stepMemoryStepEnded();

void bindStepMemory(pybind11::module& m);

}  // namespace lazy_mlir
