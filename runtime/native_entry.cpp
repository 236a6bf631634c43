#include "native_entry.h"

#include <dlfcn.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <algorithm>
#include <atomic>
#include <utility>

namespace lazy_mlir {

namespace {

// `void inductor_entry_impl(AtenTensorHandle*, AtenTensorHandle*)`, as the
// C++ wrapper declares it (not extern "C").
constexpr const char* kEntrySymbol = "_Z19inductor_entry_implPP16AtenTensorOpaqueS1_";

std::atomic<bool> g_native_calls{true};

}  // namespace

bool nativeCallsOn() { return g_native_calls.load(std::memory_order_relaxed); }

NativeEntry::NativeEntry(const std::string& library, std::vector<int64_t> arguments, int64_t num_results,
                         std::vector<int64_t> outputs, const std::vector<int64_t>& aliases,
                         const std::vector<at::Tensor>& seen, const std::vector<int64_t>& scalars, Moves moves)
    : arguments_(std::move(arguments)),
      num_results_(num_results),
      outputs_(std::move(outputs)),
      aliased_(outputs_.size(), false),
      moves_(std::move(moves)) {
  for (const int64_t k : arguments_) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(seen.size()), "lazy_mlir: entry argument ", k, " of ",
                seen.size(), " inputs");
  }
  for (const int64_t k : outputs_) {
    TORCH_CHECK(k < num_results_ && -1 - k < static_cast<int64_t>(seen.size()), "lazy_mlir: output ", k);
  }
  for (const int64_t j : aliases) {
    TORCH_CHECK(j >= 0 && j < static_cast<int64_t>(outputs_.size()) && outputs_[j] >= 0, "lazy_mlir: alias ", j);
    aliased_[j] = true;
  }
  layouts_.reserve(seen.size());
  for (const at::Tensor& t : seen) {
    TORCH_CHECK(t.defined(), "lazy_mlir: an undefined group input");
    layouts_.push_back({t.scalar_type(), t.device(), t.sizes().vec(), t.strides().vec()});
  }
  for (const auto& [k, strides] : moves_) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(seen.size()) && strides.size() == seen[k].sizes().size(),
                "lazy_mlir: move of input ", k);
  }
  for (const int64_t k : scalars) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(seen.size()), "lazy_mlir: scalar input ", k);
    scalars_.push_back({k, seen[k], seen[k]._version()});
  }
  // Last, as nothing after it throws. Python may have imported the library
  // (a probed group: this takes another reference) or not (code loaded from
  // the compile cache, compile_cache.native_plan). RTLD_LOCAL: every group's
  // library exports the same entry symbol.
  library_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(library_ != nullptr, "lazy_mlir: cannot load ", library, ": ", dlerror());
  entry_ = reinterpret_cast<Entry>(dlsym(library_, kEntrySymbol));
  if (entry_ == nullptr) {
    dlclose(library_);  // the destructor does not run for a constructor that throws
    TORCH_CHECK(false, "lazy_mlir: ", library, " has no ", kEntrySymbol);
  }
}

NativeEntry::~NativeEntry() {
  if (library_ != nullptr) dlclose(library_);
}

bool NativeEntry::admits(const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != layouts_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    const Layout& l = layouts_[i];
    if (!t.defined() || t.scalar_type() != l.dtype || t.device() != l.device || t.sizes() != l.sizes ||
        t.strides() != l.strides) {
      return false;
    }
  }
  for (const Scalar& s : scalars_) {
    const at::Tensor& t = inputs[s.position];
    if (t.data_ptr() != s.held.data_ptr() || t._version() != s.version) return false;
  }
  return true;
}

namespace {

// `t`'s values in a tensor of `strides`; a dim of stride 0 (an expand's)
// holds its first value (executables.in_layout).
at::Tensor inLayout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  std::vector<int64_t> sizes = t.sizes().vec();
  at::Tensor source = t;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (strides[d] == 0 && sizes[d] > 1) {
      sizes[d] = 1;
      source = source.narrow(static_cast<int64_t>(d), 0, 1);
    }
  }
  return at::empty_strided(sizes, strides, t.options()).copy_(source).expand(t.sizes());
}

}  // namespace

std::vector<at::Tensor> NativeEntry::call(const std::vector<at::Tensor>& given) const {
  namespace aoti = torch::aot_inductor;
  std::vector<at::Tensor> moved;
  if (!moves_.empty()) {
    moved = given;
    for (const auto& [k, strides] : moves_) moved[k] = inLayout(given[k], strides);
  }
  const std::vector<at::Tensor>& inputs = moves_.empty() ? given : moved;
  std::vector<AtenTensorHandle> arguments;
  arguments.reserve(arguments_.size());
  for (const int64_t k : arguments_) arguments.push_back(aoti::new_tensor_handle(at::Tensor(inputs[k])));
  std::vector<AtenTensorHandle> results(num_results_, nullptr);
  entry_(arguments.data(), results.data());  // takes the argument handles
  // The code returns one handle twice for an output that is another output's
  // buffer (`output_handles[9] = output_handles[8]`): one tensor, freed once.
  std::vector<at::Tensor> taken;
  taken.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    AtenTensorHandle h = results[i];
    TORCH_CHECK(h != nullptr, "lazy_mlir: the generated code returned no tensor");
    const auto first = std::find(results.begin(), results.begin() + i, h);
    if (first != results.begin() + i) {
      taken.push_back(taken[first - results.begin()]);
      continue;
    }
    at::Tensor* t = aoti::tensor_handle_to_tensor_pointer(h);
    taken.push_back(std::move(*t));
    delete t;
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(outputs_.size());
  for (size_t j = 0; j < outputs_.size(); ++j) {
    const int64_t k = outputs_[j];
    outputs.push_back(k < 0 ? inputs[-1 - k] : aliased_[j] ? taken[k].alias() : taken[k]);
  }
  return outputs;
}

void NativeEntrySlot::set(std::shared_ptr<NativeEntry> entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  entry_ = std::move(entry);
}

std::shared_ptr<NativeEntry> NativeEntrySlot::get() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entry_;
}

void bindNativeEntry(pybind11::module& m) {
  namespace py = pybind11;
  m.def("set_native_calls", [](bool on) { g_native_calls = on; });
  py::class_<NativeEntrySlot, std::shared_ptr<NativeEntrySlot>>(m, "NativeEntrySlot")
      .def(py::init<>())
      .def(
          "set",
          [](NativeEntrySlot& slot, const std::string& library, std::vector<int64_t> arguments, int64_t num_results,
             std::vector<int64_t> outputs, const std::vector<int64_t>& aliases, const std::vector<at::Tensor>& seen,
             const std::vector<int64_t>& scalars, NativeEntry::Moves moves) {
            slot.set(std::make_shared<NativeEntry>(library, std::move(arguments), num_results, std::move(outputs),
                                                   aliases, seen, scalars, std::move(moves)));
          },
          "Calls from C++ the code of `library` (see runtime/native_entry.h).")
      .def(
          "call",
          [](const NativeEntrySlot& slot, const std::vector<at::Tensor>& inputs) {
            std::shared_ptr<NativeEntry> entry = slot.get();
            TORCH_CHECK(entry != nullptr && entry->admits(inputs), "lazy_mlir: the native entry does not take these inputs");
            return entry->call(inputs);
          },
          "Runs the entry from Python (a group's first run of code loaded from the cache).")
      .def("clear", &NativeEntrySlot::clear)
      .def_property_readonly("active", [](const NativeEntrySlot& slot) { return slot.get() != nullptr; });
}

}  // namespace lazy_mlir
