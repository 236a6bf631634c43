// DrawStream: the lazy device's random-number state, for code that saves
// a generator's state and sets it back to draw the same numbers again:
// torch.utils.checkpoint's recompute (activation checkpointing, HF's
// gradient_checkpointing_enable) does so around the forward it runs again
// in the backward, so that its dropout masks are the forward's.
//
// A lazy draw takes its numbers when its graph runs, not when it is traced,
// so saving and setting a generator's state while tracing cannot make two
// draws equal: the recompute's masks would be new ones (a gradient unlike
// eager's, silently). Instead the draws traced since the last mark_step
// form a stream; the state (torch.lazy.get_rng_state) is a position in it.
// Set back to an earlier position, the next draws are the stream's draws
// from there: the same values (the same IR node while no sync of every
// live tensor has run it, the tensor it gave otherwise), not new ones.
// Past the stream's end a draw is new and appended. Draws are kept only
// from the first state saved in the step (none can rewind further): a step
// that saves none only counts them.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/lazy/backend/backend_device.h>

#include <cstdint>
#include <utility>

namespace lazy_mlir {

// (step, position): the position of the next draw in the stream of step.
std::pair<int64_t, int64_t> drawPosition();

// The next draws replay the stream from `position`. Raises if `step` is not
// the current step's (the stream of an ended step is gone) or `position`
// is past the stream's end.
void setDrawPosition(int64_t step, int64_t position);

// After a random op's Lazy kernel ran (its outputs on `stack` from
// `first_output`): while replaying, replaces its outputs by the stream's
// draw at the position and returns true (raises if that draw was another
// op or of other shapes); otherwise appends the draw and returns false.
bool streamDraw(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first_output);

// A sync of every live tensor mid-step (a value read, value_reads.h) is
// about to run: each draw it will run gets a live tensor of its own, so
// that its values outlive the sync for a replay after it (a checkpointed
// forward's masks, which nothing else keeps, read by `loss.item()` before
// the backward). At mark_step the stream ends instead: nothing kept.
void keepDrawsThroughSync(const torch::lazy::BackendDevice& device);

// Every live tensor was synced: the stream's nodes have run and must not
// run again; the tensors kept hold the values.
void drawsSettled();

// mark_step: a new step, an empty stream.
void newDrawStream();

}  // namespace lazy_mlir
