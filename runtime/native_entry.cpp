#include "native_entry.h"

#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

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
                         std::vector<int64_t> outputs, const std::vector<at::Tensor>& seen,
                         const std::vector<int64_t>& scalars)
    : arguments_(std::move(arguments)), num_results_(num_results), outputs_(std::move(outputs)) {
  for (const int64_t k : arguments_) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(seen.size()), "lazy_mlir: entry argument ", k, " of ",
                seen.size(), " inputs");
  }
  for (const int64_t k : outputs_) {
    TORCH_CHECK(k < num_results_ && -1 - k < static_cast<int64_t>(seen.size()), "lazy_mlir: output ", k);
  }
  layouts_.reserve(seen.size());
  for (const at::Tensor& t : seen) {
    TORCH_CHECK(t.defined(), "lazy_mlir: an undefined group input");
    layouts_.push_back({t.scalar_type(), t.device(), t.sizes().vec(), t.strides().vec()});
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

std::vector<at::Tensor> NativeEntry::call(const std::vector<at::Tensor>& inputs) const {
  namespace aoti = torch::aot_inductor;
  std::vector<AtenTensorHandle> arguments;
  arguments.reserve(arguments_.size());
  for (const int64_t k : arguments_) arguments.push_back(aoti::new_tensor_handle(at::Tensor(inputs[k])));
  std::vector<AtenTensorHandle> results(num_results_, nullptr);
  entry_(arguments.data(), results.data());  // takes the argument handles
  std::vector<at::Tensor> taken;
  taken.reserve(results.size());
  for (AtenTensorHandle h : results) {
    TORCH_CHECK(h != nullptr, "lazy_mlir: the generated code returned no tensor");
    at::Tensor* t = aoti::tensor_handle_to_tensor_pointer(h);
    taken.push_back(std::move(*t));
    delete t;
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(outputs_.size());
  for (const int64_t k : outputs_) outputs.push_back(k >= 0 ? taken[k] : inputs[-1 - k]);
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
             std::vector<int64_t> outputs, const std::vector<at::Tensor>& seen, const std::vector<int64_t>& scalars) {
            slot.set(std::make_shared<NativeEntry>(library, std::move(arguments), num_results, std::move(outputs),
                                                   seen, scalars));
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
