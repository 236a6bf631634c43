#include "compiled_group.h"

#include <algorithm>
#include <utility>

#include "lazy_backend/memory/buffer_donation.h"
#include "run_stats.h"
#include "step_memory.h"

namespace lazy_mlir {

CompiledGroup::CompiledGroup(std::string name, pybind11::object executable, int64_t num_outputs,
                             std::shared_ptr<NativeEntrySlot> native)
    : name_(std::move(name)), executable_(std::move(executable)), native_(std::move(native)), num_outputs_(num_outputs) {}

namespace {

// Donated inputs whose buffer is still in use after this execution are
// replaced by a copy (one per buffer: positions that held one tensor keep
// holding one). Returns the data pointers of the dead buffers handed over.
std::vector<const void*> protectDonated(std::vector<at::Tensor>& inputs, const std::vector<int64_t>& positions) {
  std::vector<const void*> writable;
  const DeadBuffers* dead = DeadBuffers::current();
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> copies;
  for (const int64_t k : positions) {
    if (k < 0 || k >= static_cast<int64_t>(inputs.size())) continue;
    at::Tensor& input = inputs[k];
    if (input.dim() == 0) continue;  // lazy_mlir.codegen.donation never writes 0-d inputs
    const c10::TensorImpl* impl = input.unsafeGetTensorImpl();
    if (dead != nullptr && dead->contains(impl)) {
      writable.push_back(input.data_ptr());
      continue;
    }
    auto it = std::find_if(copies.begin(), copies.end(), [&](const auto& c) { return c.first == impl; });
    if (it == copies.end()) {
      copies.emplace_back(impl, input.clone(at::MemoryFormat::Preserve));
      it = copies.end() - 1;
      RunStats::get().donor_copies.fetch_add(1);
      RunStats::get().donor_copy_bytes.fetch_add(static_cast<int64_t>(input.nbytes()));
    }
    input = it->second;
  }
  // A copy's other positions (the same tensor read twice) take the copy too.
  for (auto& input : inputs) {
    for (const auto& [impl, copy] : copies) {
      if (input.unsafeGetTensorImpl() == impl) input = copy;
    }
  }
  std::sort(writable.begin(), writable.end());
  return writable;
}

}  // namespace

std::vector<at::Tensor> CompiledGroup::run(std::vector<at::Tensor> inputs) {
  const int64_t start = nowNs();
  const StepMemoryScope step_memory;  // the group's large buffers are kept for the next step
  // Until the first call has returned, every donated position is offered; it
  // tells which can ever be written (lazy_mlir.codegen.donation writes an input only
  // with an output of its sizes and dtype, and this group's shapes are fixed).
  struct Offered {
    int64_t position;
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
  };
  std::vector<Offered> offered;
  if (!donated_checked_) {
    for (const int64_t k : donated_) {
      if (k >= 0 && k < static_cast<int64_t>(inputs.size())) {
        offered.push_back({k, inputs[k].sizes().vec(), inputs[k].scalar_type()});
      }
    }
  }
  const std::vector<const void*> writable = donated_.empty() ? std::vector<const void*>() : protectDonated(inputs, donated_);
  std::shared_ptr<NativeEntry> native = native_ && nativeCallsOn() ? native_->get() : nullptr;
  if (native != nullptr && !native->admits(inputs)) native = nullptr;  // Python adapts the code
  std::vector<at::Tensor> outputs;
  {
    pybind11::gil_scoped_acquire gil;
    try {
      if (native != nullptr) {
        const int64_t called = nowNs();
        outputs = native->call(inputs);
        RunStats::get().native_ns.fetch_add(nowNs() - called);
        RunStats::get().native_calls.fetch_add(1);
      } else {
        pybind11::object result = executable_.get()(pybind11::cast(std::move(inputs)));
        outputs = result.cast<std::vector<at::Tensor>>();
      }
    } catch (const std::exception& e) {  // a Python error (error_already_set) or the native entry's
      TORCH_CHECK(false, "lazy_mlir: compiled group ", name_, " failed at run time: ", e.what());
    }
  }
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == num_outputs_, "lazy_mlir: compiled group ",
              name_, " returned ", outputs.size(), " tensors, expected ", num_outputs_);
  if (!donated_checked_) {
    std::vector<int64_t> writable_positions;
    for (const auto& o : offered) {
      const bool fits = std::any_of(outputs.begin(), outputs.end(), [&](const at::Tensor& out) {
        return out.defined() && out.scalar_type() == o.dtype && out.sizes() == c10::IntArrayRef(o.sizes);
      });
      if (fits) writable_positions.push_back(o.position);
    }
    donated_ = std::move(writable_positions);
    donated_checked_ = true;
  }
  int64_t bytes = 0, in_place = 0, in_place_bytes = 0;
  for (const auto& output : outputs) {
    const auto nbytes = static_cast<int64_t>(output.defined() ? output.nbytes() : 0);
    bytes += nbytes;
    if (!writable.empty() && output.defined() &&
        std::binary_search(writable.begin(), writable.end(), static_cast<const void*>(output.data_ptr()))) {
      ++in_place;
      in_place_bytes += nbytes;
    }
  }
  RunStats& stats = RunStats::get();
  stats.group_outputs.fetch_add(static_cast<int64_t>(outputs.size()));
  stats.group_output_bytes.fetch_add(bytes);
  if (in_place) {
    stats.outputs_in_place.fetch_add(in_place);
    stats.in_place_bytes.fetch_add(in_place_bytes);
  }
  const int64_t elapsed = nowNs() - start;
  calls_.fetch_add(1);
  total_ns_.fetch_add(elapsed);
  RunStats::get().group_calls.fetch_add(1);
  RunStats::get().group_ns.fetch_add(elapsed);
  return outputs;
}

void registerCompiledGroupClass() {
  static bool done = false;
  if (done) return;
  done = true;
  static auto cls = torch::class_<CompiledGroup>("lazy_mlir", "CompiledGroup")
                        .def("run", &CompiledGroup::run)
                        .def("calls", &CompiledGroup::calls)
                        .def("total_ns", &CompiledGroup::totalNs);
}

}  // namespace lazy_mlir
