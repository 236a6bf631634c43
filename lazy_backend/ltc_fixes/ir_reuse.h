// IR reuse across steps: a training loop traces the same op sequence every
// step, and LTC can hand back last step's IR node for each op instead of
// inferring its shape and building it again (FLAGS_torch_lazy_reuse_ir: a
// trie of the op sequences seen, walked as a step traces, reset by
// mark_step). Stock LTC leaves four problems with it, handled here:
//  1. A tensor that was only read keeps its device-data node as IR value
//     across steps. The next step skips that node's place in the trie, and
//     the next device data of the same shape can take the node over: its
//     data is replaced, and the tensor silently reads another tensor's
//     values. Such cached nodes are dropped (the tensor keeps its data).
//  2. Device-data nodes in the trie keep the buffers of the step they last
//     served alive: parameters and optimizer state of past steps (+110 MB
//     on GPT-mini). After each step, buffers held by nothing else are
//     swapped for a placeholder of the same shape.
//  3. LTC tells whether a trie node can be reused by comparing operand
//     hashes, and a device-data node hashes by shape alone: a step reading
//     two same-shaped tensors the other way round (b - a after a - b) gets
//     the old node and computes a - b. Device-data nodes built here hash
//     their ordinal in the step too (the k-th device data the step read).
//  4. A step that diverges (new sizes, a node built outside the trie) adds a
//     branch that never goes away. Each trie node keeps its most recently
//     used successors only.
#pragma once

#include <torch/csrc/lazy/core/config.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/trie.h>

#include <cstdint>

namespace lazy_mlir {

// Turns reuse on or off (off also empties the trie). The first call puts
// this module's graph executor in place of LTC's (same behaviour plus the
// clean-up after each mark_step, and the live tensors synced in
// functional_update.h's order). Its counts are in RunStats.
void setIrReuse(bool on);

// While paused, ops are traced without the trie (lazy_mlir.steady_state's
// setup graph, traced inside a model's first step: its nodes must neither
// take the step's place in the trie nor shift its device-data ordinals).
void pauseIrReuse(bool paused);

// After that setup graph: the model's first step starts here, as the next
// ones start after a mark_step; ops traced before it (model set-up code)
// must not make it trace otherwise. Not done, and false, when ops of the
// step are already pending (traced before its first forward): that first
// step then hashes unlike the next, and LTC lowers the next once more.
bool irReuseStepBoundary();

// The IR builder of the backend: `ts` (TorchScript's), with device-data
// nodes that carry their ordinal while reuse is on (3.), and recycled by
// device_data_pool.h while it is off.
const torch::lazy::IrBuilder* irReuseBuilder(const torch::lazy::IrBuilder* ts);

// LTC's trie lookup for node classes without a ClassOpKind (one class, many
// ops: BuiltinOpNode): the next node on the trie's path that is a `T` and
// `matches`, or null (then build it and torch::lazy::CacheNode it).
template <typename T, typename Match>
torch::lazy::NodePtr reuseFromTrie(const Match& matches) {
  if (!FLAGS_torch_lazy_reuse_ir) return nullptr;
  auto* trie = torch::lazy::TrieCache::Get();
  auto& successors = trie->Current()->successors;
  for (auto it = successors.begin(); it != successors.end(); ++it) {
    const auto* candidate = dynamic_cast<const T*>((*it)->ir_node.get());
    if (candidate != nullptr && matches(*candidate)) {
      torch::lazy::NodePtr node = (*it)->ir_node;
      (*it)->hit_counter++;
      trie->SetCurrent(it);
      return node;
    }
  }
  return nullptr;
}

}  // namespace lazy_mlir
