// BufferDonation: which graph inputs a compiled group may overwrite with one
// of its outputs (an in-place state update: a parameter, gradient or
// optimizer state written into its own storage instead of a fresh tensor).
// Decided in two halves.
//
// Structure, when a graph is compiled: a graph input whose only use is one
// fusion group (no TorchScript op, no other group, not a graph output, so
// not returned as is to a lazy tensor that outlives the step) is a candidate
// of that group. The group's lowering may write an output into a
// candidate's buffer (lazy_mlir.codegen.donation: aten.copy_ into the input, kept by
// Inductor as an input mutation).
//
// Run time, in ExecuteComputation before the glue graph runs: a candidate's
// buffer is dead after this sync when nothing outside the sync can read it:
//  - its BackendData is held only by LTC's parameter list and this sync's
//    device-data nodes (no live lazy tensor has it as its data, no cache);
//  - its tensor is held only by such BackendData, all candidates of the
//    same group (LTC hands a weight read twice as two BackendData sharing
//    one tensor), and by its preserved Python object when no Python code
//    holds that;
//  - its storage by that one tensor (no view of it anywhere), and by its
//    preserved Python storage object when no Python code holds that.
// CompiledGroup::run hands dead buffers to the generated code as they are
// and clones any other candidate first: the code then writes into the copy
// (one copy, still correct).
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/backend/backend_data.h>

#include <cstdint>
#include <vector>

namespace lazy_mlir {

class SyncRecord;

// The buffers (tensor implementations) that this thread's current graph
// execution may overwrite.
class DeadBuffers {
 public:
  bool empty() const { return impls_.empty(); }
  bool contains(const c10::TensorImpl* impl) const;
  void add(const c10::TensorImpl* impl) { impls_.push_back(impl); }
  void seal();  // sorts for contains()

  // The set of the execution in progress on this thread; null outside one.
  static const DeadBuffers* current();

  // Installs `buffers` as this thread's current set for its lifetime.
  class Scope {
   public:
    explicit Scope(const DeadBuffers* buffers);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const DeadBuffers* previous_;
  };

 private:
  std::vector<const c10::TensorImpl*> impls_;
};

class BufferDonation {
 public:
  // Before binding: the input positions of `fusion_group` that are donor
  // candidates (graph inputs used by this group alone).
  static std::vector<int64_t> groupCandidates(const torch::jit::Node* fusion_group);

  // After binding: per graph input, an id of the compiled-group call it is a
  // candidate of, -1 if none. Empty when no input is a candidate.
  static std::vector<int32_t> donorGroups(const torch::jit::Graph& glue);

  // The candidates' buffers that are dead after this sync (see above).
  // `record` must describe `arguments` (SyncRecord::describes).
  static DeadBuffers find(c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
                          const std::vector<int32_t>& donor_groups, const SyncRecord& record);
};

}  // namespace lazy_mlir
