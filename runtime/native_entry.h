// NativeEntry: a group's code compiled by Inductor's C++ wrapper, called
// from CompiledGroup::run without Python.
//
// The library Inductor builds for such a group exports
// `void inductor_entry_impl(AtenTensorHandle* inputs, AtenTensorHandle* outputs)`
// (it steals the input handles and hands over the output handles). Its
// Python way in (AOTAutograd's runtime wrapper, Inductor's CompiledFxGraph,
// the generated `call`) wraps every input and output in a Python tensor;
// an output's Python object then lives as long as LTC holds the tensor and
// is freed in the next step's trace. lazy_mlir.codegen.native_call watched one call
// through Python and says which group input each entry argument is and
// which entry result (or group input) each group output is; a call is
// taken here while the inputs keep the dtypes, devices, sizes and strides
// of that call (the code was compiled for them), else Python runs it.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lazy_mlir {

class NativeEntry {
 public:
  // `arguments[i]`: the group input passed as entry argument i.
  // `outputs[j]` >= 0: group output j is entry result outputs[j]; < 0: it is
  // group input -1 - outputs[j]. `seen`: the group's inputs at that call.
  // `aliases`: outputs returned as a new alias (at::alias) of their entry
  // result, as AOTAutograd's wrapper returns a new view for an output that
  // aliases an input. `scalars`: inputs whose values the code took as
  // constants; admitted only as the very tensors seen, unwritten since
  // (executables.ScalarGuards). `moves`: (input, strides) to copy into
  // before the call, the layouts the code took (GroupExecutable._adapt_layouts);
  // `seen` holds them as given, before the moves.
  using Moves = std::vector<std::pair<int64_t, std::vector<int64_t>>>;
  NativeEntry(const std::string& library, std::vector<int64_t> arguments, int64_t num_results,
              std::vector<int64_t> outputs, const std::vector<int64_t>& aliases, const std::vector<at::Tensor>& seen,
              const std::vector<int64_t>& scalars, Moves moves);
  ~NativeEntry();
  NativeEntry(const NativeEntry&) = delete;
  NativeEntry& operator=(const NativeEntry&) = delete;

  bool admits(const std::vector<at::Tensor>& inputs) const;
  // Call with the GIL held: the entry releases it around the kernels.
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs) const;

 private:
  struct Layout {
    at::ScalarType dtype;
    c10::Device device;
    std::vector<int64_t> sizes, strides;
  };
  using Entry = void (*)(AtenTensorHandle*, AtenTensorHandle*);
  void* library_ = nullptr;  // dlopen's handle: holds the library loaded
  Entry entry_ = nullptr;
  std::vector<int64_t> arguments_;
  int64_t num_results_;
  std::vector<int64_t> outputs_;
  std::vector<bool> aliased_;  // per output: returned as a new alias
  std::vector<Layout> layouts_;
  struct Scalar {
    int64_t position;
    at::Tensor held;  // held, so that its memory holds no other value
    int64_t version;
  };
  std::vector<Scalar> scalars_;
  Moves moves_;
};

// What a GroupExecutable's current code offers its CompiledGroup: set by
// Python when a probe succeeded, cleared whenever the code changes.
class NativeEntrySlot {
 public:
  void set(std::shared_ptr<NativeEntry> entry);
  void clear() { set(nullptr); }
  std::shared_ptr<NativeEntry> get() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<NativeEntry> entry_;
};

// Whether CompiledGroup::run takes native entries (Config.native_calls).
bool nativeCallsOn();

void bindNativeEntry(pybind11::module& m);

}  // namespace lazy_mlir
