// GroupBinder: turns each prim::FusionGroup into a call of its compiled
// executable: a CompiledGroup constant, prim::CallMethod[name="run"] on the
// group's inputs as Tensor[], and prim::ListUnpack of the results. A group
// the Python compiler rejects is inlined back and runs in TorchScript. The
// executable is offered the group's donor candidates (buffer_donation.h).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>

namespace lazy_mlir {

class GroupBinder {
 public:
  explicit GroupBinder(std::string graph_name) : graph_name_(std::move(graph_name)) {}

  // Returns true if the group was bound, false if it was inlined back.
  bool bind(torch::jit::Node* group, int index);

  // Whether a bound group's executable accepted donations: else no run of
  // the graph needs to know which buffers are dead.
  bool anyDonated() const { return any_donated_; }

 private:
  std::string graph_name_;
  bool any_donated_ = false;
};

}  // namespace lazy_mlir
