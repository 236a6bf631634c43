#include "memory/buffer_donation.h"

#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <algorithm>
#include <unordered_map>

#include "ltc_fixes/parameter_binding.h"

namespace lazy_mlir {

namespace {

thread_local const DeadBuffers* g_current = nullptr;

bool isGroupCall(const torch::jit::Node* node) {
  static const auto run = c10::Symbol::attr("name");
  return node->kind() == torch::jit::prim::CallMethod && node->s(run) == "run";
}

// A holder of a tensor that only Python can reach: its preserved Python
// object, if no Python code references that object.
bool pythonObjectOnlyPreserved(const c10::TensorImpl* impl, bool* has_object) {
  const PyObject* object = impl->pyobj_slot()->load_pyobj();
  *has_object = object != nullptr;
  return object == nullptr || impl->pyobj_slot()->has_unique_reference();
}

// Whether a storage is held by one tensor alone. Python code that asked for
// the tensor's storage (``untyped_storage()``: Inductor's and AOTAutograd's
// alias checks at a group's first run through Python, ours) left a Python
// storage object that the storage preserves once Python lets go of it, and
// that object holds the storage: one use more, which no one can read
// through while no Python code references the object.
bool storageOfOneTensor(const c10::Storage& storage) {
  const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl->pyobj_slot()->load_pyobj() == nullptr) return storage.use_count() == 1;
  return storage.use_count() == 2 && impl->pyobj_slot()->has_unique_reference();
}

}  // namespace

bool DeadBuffers::contains(const c10::TensorImpl* impl) const {
  return std::binary_search(impls_.begin(), impls_.end(), impl);
}

void DeadBuffers::seal() { std::sort(impls_.begin(), impls_.end()); }

const DeadBuffers* DeadBuffers::current() { return g_current; }

DeadBuffers::Scope::Scope(const DeadBuffers* buffers) : previous_(g_current) { g_current = buffers; }

DeadBuffers::Scope::~Scope() { g_current = previous_; }

std::vector<int64_t> BufferDonation::groupCandidates(const torch::jit::Node* fusion_group) {
  std::vector<int64_t> positions;
  const auto inputs = fusion_group->inputs();
  for (size_t k = 0; k < inputs.size(); ++k) {
    const torch::jit::Value* value = inputs[k];
    // One use in all: this group (a graph output is a use by the return node).
    if (value->node()->kind() == torch::jit::prim::Param && value->uses().size() == 1 &&
        value->type()->cast<c10::TensorType>()) {
      positions.push_back(static_cast<int64_t>(k));
    }
  }
  return positions;
}

std::vector<int32_t> BufferDonation::donorGroups(const torch::jit::Graph& glue) {
  std::vector<int32_t> groups(glue.inputs().size(), -1);
  std::unordered_map<const torch::jit::Node*, int32_t> ids;
  bool any = false;
  for (size_t a = 0; a < glue.inputs().size(); ++a) {
    const torch::jit::Value* value = glue.inputs()[a];
    if (value->uses().size() != 1) continue;
    const torch::jit::Node* list = value->uses()[0].user;
    if (list->kind() != torch::jit::prim::ListConstruct || list->output()->uses().size() != 1) continue;
    const torch::jit::Node* call = list->output()->uses()[0].user;
    if (!isGroupCall(call)) continue;
    groups[a] = ids.emplace(call, static_cast<int32_t>(ids.size())).first->second;
    any = true;
  }
  if (!any) groups.clear();
  return groups;
}

DeadBuffers BufferDonation::find(c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
                                 const std::vector<int32_t>& donor_groups, const SyncRecord& record) {
  struct Seen {
    const c10::TensorImpl* impl;
    int32_t group;
    long data_holders;  // BackendData objects holding the tensor
    bool ok;
  };
  std::vector<Seen> seen;
  const size_t n = std::min(arguments.size(), donor_groups.size());
  for (size_t a = 0; a < n; ++a) {
    if (donor_groups[a] < 0) continue;
    const torch::lazy::BackendDataPtr& data = arguments[a];
    auto* ts = dynamic_cast<torch::lazy::TSData*>(data.get());
    if (ts == nullptr || ts->scalar.has_value() || !ts->HasValue()) continue;
    // LTC's parameter list holds it once, each of this sync's device-data nodes once.
    bool ok = data.use_count() == 1 + static_cast<long>(record.nodesOf(a));
    const at::Tensor tensor = ts->data();  // one more use while held here
    const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    bool has_object = false;
    ok = ok && storageOfOneTensor(tensor.storage()) && pythonObjectOnlyPreserved(impl, &has_object);
    seen.push_back({impl, donor_groups[a], static_cast<long>(tensor.use_count()) - 1 - (has_object ? 1 : 0), ok});
  }
  std::sort(seen.begin(), seen.end(), [](const Seen& x, const Seen& y) { return x.impl < y.impl; });
  DeadBuffers dead;
  for (size_t i = 0; i < seen.size();) {
    size_t j = i;
    bool ok = true;
    while (j < seen.size() && seen[j].impl == seen[i].impl) {
      ok = ok && seen[j].ok && seen[j].group == seen[i].group;
      ++j;
    }
    // Every BackendData holding the tensor is one of these candidates.
    if (ok && seen[i].data_holders == static_cast<long>(j - i)) dead.add(seen[i].impl);
    i = j;
  }
  dead.seal();
  return dead;
}

}  // namespace lazy_mlir
