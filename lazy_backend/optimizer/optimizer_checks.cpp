#include "optimizer/optimizer_checks.h"

#include <torch/csrc/autograd/python_variable.h>

namespace lazy_mlir {

std::optional<std::string> groupTensorsUnfusable(const std::vector<at::Tensor>& params,
                                                 const std::vector<at::Tensor>& state_steps) {
  for (const at::Tensor& step : state_steps) {
    if (!step.device().is_cpu()) return "step counts not on the CPU";
  }
  for (const at::Tensor& p : params) {
    if (p.is_complex()) return "complex parameters";
  }
  if (params.empty()) return std::nullopt;
  const c10::Device device = params[0].device();
  for (const at::Tensor& p : params) {
    const at::ScalarType t = p.scalar_type();
    const bool floating = t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble;
    if (device.type() != c10::kLazy || p.device() != device || !floating) {
      return "parameters not all floating-point on one lazy device";
    }
  }
  return std::nullopt;
}

pybind11::object collectAdamGroup(const pybind11::list& params, const pybind11::dict& state, bool amsgrad,
                                  const pybind11::list& params_with_grad, const pybind11::list& grads,
                                  const pybind11::list& exp_avgs, const pybind11::list& exp_avg_sqs,
                                  const pybind11::list& max_exp_avg_sqs, const pybind11::list& state_steps) {
  // collected first, appended only once every parameter qualified
  std::vector<pybind11::object> taken_params, taken_grads, taken_avgs, taken_sqs, taken_maxes, taken_steps;
  bool has_complex = false;
  auto entry = [](PyObject* dict, const char* key, std::vector<pybind11::object>& into) {
    PyObject* value = PyDict_GetItemString(dict, key);  // borrowed
    if (value == nullptr) return false;
    into.push_back(pybind11::reinterpret_borrow<pybind11::object>(value));
    return true;
  };
  for (pybind11::handle p : params) {
    if (!THPVariable_Check(p.ptr())) return pybind11::none();
    const at::Tensor& param = THPVariable_Unpack(p.ptr());
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    if (grad.is_sparse()) return pybind11::none();
    has_complex |= param.is_complex();
    PyObject* param_state = PyDict_GetItemWithError(state.ptr(), p.ptr());  // borrowed; no defaultdict insert
    if (param_state == nullptr) {
      if (PyErr_Occurred()) throw pybind11::error_already_set();
      return pybind11::none();
    }
    if (!PyDict_Check(param_state) || PyDict_GET_SIZE(param_state) == 0) return pybind11::none();
    if (!entry(param_state, "exp_avg", taken_avgs) || !entry(param_state, "exp_avg_sq", taken_sqs) ||
        (amsgrad && !entry(param_state, "max_exp_avg_sq", taken_maxes)) ||
        !entry(param_state, "step", taken_steps)) {
      return pybind11::none();
    }
    taken_params.push_back(pybind11::reinterpret_borrow<pybind11::object>(p));
    taken_grads.push_back(pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(grad)));
  }
  auto append = [](pybind11::list to, const std::vector<pybind11::object>& values) {
    for (const auto& value : values) to.append(value);
  };
  append(params_with_grad, taken_params);
  append(grads, taken_grads);
  append(exp_avgs, taken_avgs);
  append(exp_avg_sqs, taken_sqs);
  append(max_exp_avg_sqs, taken_maxes);
  append(state_steps, taken_steps);
  return pybind11::bool_(has_complex);
}

}  // namespace lazy_mlir
