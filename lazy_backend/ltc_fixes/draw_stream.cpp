#include "ltc_fixes/draw_stream.h"

#include <c10/util/Exception.h>
#include <torch/csrc/lazy/core/tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace lazy_mlir {

namespace {

// One output of a draw: its IR value, held weakly (a node nothing else
// holds is gone, and the stream must not keep it: dead_draws.h counts who
// holds a draw; a weak pointer to its tensor would keep LTC's tensor, and
// its node, alive too).
struct DrawnOutput {
  std::weak_ptr<torch::lazy::Node> node;
  size_t index = 0;
  at::Tensor kept;  // its values through a mid-step sync (keepDrawsThroughSync)
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// At the Lazy key random ops arrive functionalized (aten::uniform, not
// uniform_): every output is a new tensor, which a replay replaces.
struct Draw {
  c10::OperatorName op;
  bool settled = false;  // a sync of every live tensor ran it: its node must not run again
  std::vector<DrawnOutput> outputs;
};

std::mutex g_mutex;
int64_t g_step = 0;
size_t g_position = 0;  // of the next draw; below the stream's end while replaying
// The draws from the first position a state was saved at in this step: no
// draw before it can be replayed, so none is kept (a step that saves no
// state records nothing, only counts).
bool g_recording = false;
size_t g_base = 0;  // the position of g_stream[0]
std::vector<Draw> g_stream;

size_t streamEnd() { return g_base + g_stream.size(); }

std::string opName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

Draw record(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t first_output) {
  Draw draw{op.operator_name()};
  for (size_t i = first_output; i < stack.size(); ++i) {
    DrawnOutput out;
    if (stack[i].isTensor()) {
      const at::Tensor& tensor = stack[i].toTensor();
      out.sizes = tensor.sizes().vec();
      out.dtype = tensor.scalar_type();
      if (auto ltc = torch::lazy::TryGetLtcTensor(tensor)) {
        torch::lazy::Value value = ltc->CurrentIrValue();
        out.node = value.node;
        out.index = value.index;
      }
    }
    draw.outputs.push_back(std::move(out));
  }
  return draw;
}

// The value a replayed output takes: the draw's node while no sync of
// every live tensor has run it, else the tensor kept through that sync.
// None for a node that died unrun: nothing read that draw, so the new one
// is as good (its values were never made).
std::optional<torch::lazy::Value> drawnValue(const Draw& draw, const DrawnOutput& out, const std::string& op) {
  if (out.kept.defined()) return torch::lazy::TryGetLtcTensor(out.kept)->GetIrValue();
  auto node = out.node.lock();
  TORCH_CHECK(!draw.settled, "lazy_mlir: ", op, " replayed after torch.lazy.set_rng_state "
              "(torch.utils.checkpoint's recompute): its first draw ran at a sync of every live tensor and its "
              "values were not kept");
  if (node) return torch::lazy::Value(node, out.index);
  return std::nullopt;
}

void replay(const Draw& draw, size_t position, const c10::OperatorHandle& op, torch::jit::Stack* stack,
            size_t first_output) {
  const size_t outputs = stack->size() - first_output;
  TORCH_CHECK(draw.op == op.operator_name() && draw.outputs.size() == outputs, "lazy_mlir: draw ", position,
              " of the step replayed after torch.lazy.set_rng_state (torch.utils.checkpoint's recompute) is ",
              opName(op.operator_name()), ", but it was ", opName(draw.op),
              ": the code run again does not draw as it did the first time");
  for (size_t i = 0; i < outputs; ++i) {
    at::Tensor fresh = (*stack)[first_output + i].toTensor();
    const DrawnOutput& out = draw.outputs[i];
    TORCH_CHECK(fresh.sizes().vec() == out.sizes && fresh.scalar_type() == out.dtype, "lazy_mlir: ",
                opName(draw.op), " replayed after torch.lazy.set_rng_state (torch.utils.checkpoint's recompute) "
                "draws ", fresh.sizes(), " ", fresh.scalar_type(), ", but drew ", c10::IntArrayRef(out.sizes), " ",
                out.dtype, " the first time");
    std::optional<torch::lazy::Value> value = drawnValue(draw, out, opName(draw.op));
    if (!value) continue;
    const auto& device = torch::lazy::TryGetLtcTensor(fresh)->GetDevice();
    (*stack)[first_output + i] = torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(*value, device));
  }
}

}  // namespace

std::pair<int64_t, int64_t> drawPosition() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_recording) {  // nothing recorded yet: the stream starts here
    g_recording = true;
    g_base = g_position;
  }
  return {g_step, static_cast<int64_t>(g_position)};
}

void setDrawPosition(int64_t step, int64_t position) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(step == g_step, "lazy_mlir: torch.lazy.set_rng_state: the state is from step ", step,
              " but this is step ", g_step, ": a step's draws are taken at its mark_step, so a state saved before "
              "that cannot draw them again");
  TORCH_CHECK(position >= static_cast<int64_t>(g_base) && static_cast<size_t>(position) <= streamEnd(),
              "lazy_mlir: torch.lazy.set_rng_state: position ", position, " is not one of the ", streamEnd(),
              " draws of this step");
  g_position = static_cast<size_t>(position);
}

bool streamDraw(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first_output) {
  std::unique_lock<std::mutex> lock(g_mutex);
  if (g_position < streamEnd()) {
    const size_t position = g_position++;
    const Draw draw = g_stream[position - g_base];
    lock.unlock();  // building IR can trace (a cast): not under the lock
    replay(draw, position, op, stack, first_output);
    return true;
  }
  if (!g_recording) {
    g_base = ++g_position;
    return false;
  }
  lock.unlock();
  Draw draw = record(op, *stack, first_output);
  lock.lock();
  g_stream.push_back(std::move(draw));
  g_position = streamEnd();
  return false;
}

void keepDrawsThroughSync(const torch::lazy::BackendDevice& device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& draw : g_stream) {
    if (draw.settled) continue;
    for (auto& out : draw.outputs) {
      auto node = out.node.lock();
      if (node && !out.kept.defined()) {
        out.kept = torch::lazy::CreateAtenFromLtcTensor(
            torch::lazy::LazyTensor::Create(torch::lazy::Value(node, out.index), device));
      }
    }
  }
}

void drawsSettled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& draw : g_stream) draw.settled = true;
}

void newDrawStream() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_stream.clear();
  g_position = 0;
  g_base = 0;
  g_recording = false;
  ++g_step;
}

}  // namespace lazy_mlir
