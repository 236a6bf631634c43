// CompiledComputation: what LazyMlirBackend::Compile hands to LTC. It runs
// the rewritten glue graph like any TSComputation, and remembers the LTC
// graph it was made from and the configuration it was compiled under. LTC
// caches computations by graph hash alone, so after lazy_mlir.init() changes
// the configuration, the backend recompiles from the source graph instead of
// running stale code (variants are kept per configuration). LTC's hash also
// misses which parameter each shared device-data use reads
// (parameter_binding.h): the computation remembers the binding it was
// lowered for and keeps variants for the other bindings met under its hash.
// It also knows whether its glue graph runs random ops (syncs.py warns when
// a value read mid-step does), found once here rather than at every run.
#pragma once

#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>

#include <algorithm>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ltc_fixes/draw_order.h"
#include "ltc_fixes/parameter_binding.h"

namespace lazy_mlir {

class CompiledComputation : public torch::lazy::TSComputation {
 public:
  using Compiler = std::function<std::shared_ptr<CompiledComputation>(
      const std::shared_ptr<torch::jit::Graph>& source)>;

  CompiledComputation(std::shared_ptr<torch::jit::Graph> glue, std::shared_ptr<torch::jit::Graph> source,
                      std::string config_key)
      : TSComputation(glue),
        source_(std::move(source)),
        config_key_(std::move(config_key)),
        // random ops stay in the glue graph (never in a compiled group): its top level is enough
        draws_random_(std::any_of(glue->nodes().begin(), glue->nodes().end(),
                                  [](const torch::jit::Node* node) { return isRandomOp(node->kind()); })) {}

  const std::string& configKey() const { return config_key_; }
  bool drawsRandom() const { return draws_random_; }

  // Per graph input, the compiled-group call it may be donated to, -1 if
  // none; empty when no group takes a donation (buffer_donation.h).
  const std::vector<int32_t>& donorGroups() const { return donor_groups_; }
  void setDonorGroups(std::vector<int32_t> groups) { donor_groups_ = std::move(groups); }

  const GraphBinding& binding() const { return binding_; }
  void setBinding(GraphBinding binding) { binding_ = std::move(binding); }

  // The variant lowered for the device-data uses hashed `uses_hash`, lowered
  // by `lower` on first use.
  std::shared_ptr<CompiledComputation> forBinding(
      uint64_t uses_hash, const std::function<std::shared_ptr<CompiledComputation>()>& lower) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& variant = binding_variants_[uses_hash];
    if (!variant) variant = lower();
    return variant;
  }

  // This computation if compiled under `config_key`, else the variant for it,
  // compiled on first use.
  std::shared_ptr<torch::lazy::TSComputation> forConfig(
      const std::shared_ptr<CompiledComputation>& self, const std::string& config_key,
      const Compiler& compile) {
    if (config_key == config_key_) return self;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& variant = variants_[config_key];
    if (!variant) variant = compile(source_);
    return variant;
  }

 private:
  std::shared_ptr<torch::jit::Graph> source_;  // the LTC graph (a private copy)
  std::string config_key_;
  bool draws_random_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<CompiledComputation>> variants_;
  GraphBinding binding_;
  std::vector<int32_t> donor_groups_;
  std::map<uint64_t, std::shared_ptr<CompiledComputation>> binding_variants_;
};

}  // namespace lazy_mlir
