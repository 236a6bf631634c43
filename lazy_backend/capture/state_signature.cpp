#include "capture/state_signature.h"

#include <string>

namespace lazy_mlir {

pybind11::object stateSignature(const std::vector<at::Tensor>& tensors) {
  std::string bytes;
  bytes.reserve(tensors.size() * 32);
  auto put = [&](int64_t value) { bytes.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  for (const at::Tensor& t : tensors) {
    if (t.device().type() != c10::kLazy) return pybind11::none();
    // one word of dtype, requires_grad and rank, then the sizes: no two signatures share bytes
    put(static_cast<int64_t>(t.scalar_type()) | (int64_t{t.requires_grad()} << 8) | (t.dim() << 16));
    for (int64_t size : t.sizes()) put(size);
  }
  return pybind11::bytes(bytes);
}

namespace {
pybind11::object dictArgument(pybind11::handle value) {
  if (!PyDict_Check(value.ptr())) throw pybind11::type_error("StateEntries: expected a dict");
  return pybind11::reinterpret_borrow<pybind11::object>(value);
}
}  // namespace

StateEntries::StateEntries(const pybind11::list& dicts, const pybind11::list& entries) {
  for (pybind11::handle d : dicts) {
    dicts_.push_back(dictArgument(d));
    lengths_.push_back(PyDict_GET_SIZE(d.ptr()));
  }
  for (pybind11::handle e : entries) {
    auto entry = e.cast<pybind11::tuple>();
    if (entry.size() != 3) throw pybind11::value_error("StateEntries: an entry is (dict, key, value)");
    entries_.push_back({dictArgument(entry[0]), entry[1], entry[2]});
  }
}

bool StateEntries::unchanged() const {
  for (size_t i = 0; i < dicts_.size(); ++i) {
    if (PyDict_GET_SIZE(dicts_[i].ptr()) != lengths_[i]) return false;
  }
  for (const Entry& e : entries_) {
    // borrowed; keys are the str names the walk read (their hash is cached)
    PyObject* now = PyDict_GetItemWithError(e.dict.ptr(), e.key.ptr());
    if (now != e.value.ptr()) {
      if (now == nullptr && PyErr_Occurred()) throw pybind11::error_already_set();
      return false;
    }
  }
  return true;
}

}  // namespace lazy_mlir
