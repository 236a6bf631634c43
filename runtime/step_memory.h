// StepMemory: the large CPU buffers a compiled group allocates, planned
// once for a step that repeats, or kept for the next step instead of going
// back to the system.
//
// A training step allocates the same buffers every step, in the same order
// (activations, gradients, the optimizer's temporaries), most of them above
// glibc's mmap threshold or at the top of its heap: freed, glibc unmaps or
// trims them, and the next step touches fresh pages, a page fault per 4 KiB
// (zoo ResNet at the base size: ~1,000 faults and ~2.5 ms of a 16.8 ms
// step). This allocator wraps the CPU allocator for the buffers of at least
// kMinBytes allocated while a compiled group runs (StepMemoryScope, on that
// thread); everything else is the wrapped allocator's, untouched (eager code
// in the same process keeps glibc's behaviour).
//
// Plan: each step's allocations are recorded (sizes, and when each was
// allocated and freed); at mark_step they become a plan, offsets in one
// arena where buffers whose lifetimes do not overlap share bytes. The next
// step that asks for the same sizes in the same order takes every buffer at
// its offset: no page fault, and the arena holds about the step's peak
// (GPT-2-small's shape: 411 MiB for a 396 MiB peak; exact-size free lists
// kept 487). A buffer whose bytes are still held (one kept past its step)
// is not handed out again, and a step that asks for other sizes takes the
// rest from the free lists. A step that strays in a new way (a memory
// budget's switch to another graph, a first evaluation) gives back the
// arena's pages that no buffer of it holds meanwhile (madvise), and its
// free-list blocks at its end, so that it and the step after do not hold
// the arena beside their own buffers; one that strays as the last one did,
// with steps that followed the plan between (steps taking turns: gradient
// accumulation's last micro-batch), keeps both, and runs without page
// faults. Until a plan has served a step, buffers get pages of their own,
// unmapped when freed, so that a run's first steps hold
// no more than their live buffers either. After kMaxReplans steps in a row
// that did not repeat, planning stops until release().
//
// Free lists: a buffer no plan places (an output that outlives its step,
// a step that strays) goes, once freed, to a free list of its exact size,
// and the next request for that size inside a group takes it. Bound: the
// buffers held (live + cached) stay under twice the most bytes the groups'
// own buffers were ever live at once: a miss first frees the least recently
// freed blocks until the request fits. Blocks nothing asks for go after 16
// group calls unasked, and release() empties the cache and drops the plan
// (a group got new code: new sizes are likely).
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
// Frees every cached block and drops the plan; the peak restarts from what is live.
void releaseStepMemory();
// cached_bytes, live_bytes, peak_bytes (the most bytes live at once since the
// process began or the last release: the cache's bound is twice it),
// last_step_peak_bytes (stepMemoryStepEnded's), planned_bytes (the plan's
// arena, once it served a buffer), mapped_bytes (the live buffers of the
// steps before a plan, on pages of their own) and group_calls (scopes opened; the counts
// of planned buffers, hits, misses and evicted blocks are RunStats').
std::map<std::string, int64_t> stepMemoryStats();

// At mark_step: last_step_peak_bytes becomes the ending step's peak above
// the bytes live when it began (its activations and temporaries, not the
// state that lives on in such buffers), and the step's allocations the
// next step's plan (unless they followed this one's).
void stepMemoryStepEnded();

void bindStepMemory(pybind11::module& m);

}  // namespace lazy_mlir
