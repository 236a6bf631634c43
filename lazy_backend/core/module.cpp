// The Python extension lazy_mlir.native._C: installs the backend and exposes its
// hooks and counters. Everything else lives in Python.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/lazy/core/config.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/utils/pybind.h>

#include "runtime/compiled_group.h"
#include "runtime/run_stats.h"
#include "runtime/step_memory.h"
#include "optimizer/adam_scalars.h"
#include "nodes/builtin_op_node.h"
#include "memory/device_data_pool.h"
#include "ltc_fixes/dead_draws.h"
#include "ltc_fixes/draw_stream.h"
#include "ltc_fixes/draw_order.h"
#include "optimizer/functional_update.h"
#include "core/graph_clusterer.h"
#include "core/backend_graph_executor.h"
#include "ltc_fixes/batch_norm_kernel.h"
#include "ltc_fixes/strided_kernels.h"
#include "kernels/fill_kernels.h"
#include "kernels/safe_softmax_kernel.h"
#include "kernels/kernel_fronts.h"
#include "core/layer_regions.h"
#include "kernels/lazy_autocast.h"
#include "capture/leaf_grads.h"
#include "kernels/meta_kernels.h"
#include "optimizer/optimizer_checks.h"
#include "capture/state_signature.h"
#include "ltc_fixes/parameter_settling.h"
#include "core/lazy_mlir_backend.h"
#include "core/python_hooks.h"
#include "nodes/region_node.h"
#include "ltc_fixes/source_locations.h"
#include "ltc_fixes/value_reads.h"

namespace py = pybind11;
using lazy_mlir::Level;

namespace {

lazy_mlir::LazyMlirBackend* g_backend = nullptr;

lazy_mlir::LazyMlirBackend* installedBackend() {
  // Built on first use, after torch._lazy.ts_backend.init(); never destroyed
  // (LTC keeps a raw pointer for the life of the process).
  if (g_backend == nullptr) {
    g_backend = new lazy_mlir::LazyMlirBackend(torch::lazy::GetTSBackendImpl());
    static torch::lazy::BackendRegistrar registrar(g_backend);
  }
  return g_backend;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lazy_mlir C++ core: LTC backend, clustering, CompiledGroup binding";
  lazy_mlir::registerCompiledGroupClass();
  lazy_mlir::bindNativeEntry(m);
  lazy_mlir::bindStepMemory(m);

  m.def("install", [](int level, std::string config_key) {
    TORCH_CHECK(level >= 0 && level <= 2, "lazy_mlir: level must be 0, 1 or 2");
    // Graphs run on the thread that syncs, never on LTC's IO thread pool: the
    // parameter-binding check and buffer donation work per thread
    // (parameter_binding.h, buffer_donation.h).
    FLAGS_torch_lazy_use_thread_pool = false;
    lazy_mlir::installGraphExecutor();
    installedBackend()->configure(static_cast<Level>(level), std::move(config_key));
  }, "Install the lazy_mlir LTC backend (after the TorchScript backend) and configure it.",
     py::arg("level"), py::arg("config_key"));
  m.def("is_active", [] { return g_backend != nullptr && torch::lazy::getBackend() == g_backend; });
  m.def("set_hooks", [](py::object classify, py::object compile_group, py::object on_execute) {
    lazy_mlir::PythonHooks::get().classify.reset(std::move(classify));
    lazy_mlir::PythonHooks::get().compile_group.reset(std::move(compile_group));
    lazy_mlir::PythonHooks::get().on_execute.reset(std::move(on_execute));
  });
  m.def("cluster", [](std::shared_ptr<torch::jit::Graph> graph, bool whole_graph) {
    // Clusters `graph` in place with the registered classifier (for tests and
    // debugging); returns the number of fusion groups.
    lazy_mlir::GraphClusterer clusterer(graph, [](torch::jit::Node* node) {
      py::object result = lazy_mlir::PythonHooks::get().classify.get()(
          py::cast(node, py::return_value_policy::reference));
      return static_cast<lazy_mlir::NodeClass>(result.cast<int>());
    });
    return (whole_graph ? clusterer.runWholeGraph() : clusterer.run()).size();
  }, py::arg("graph"), py::arg("whole_graph") = false);
  m.def("trace_builtin", &lazy_mlir::traceBuiltin,
        "Trace an aten op without a lazy kernel as a TorchScript builtin node; returns lazy tensors.",
        py::arg("qualified_name"), py::arg("overload"), py::arg("args"), py::arg("outputs"),
        py::arg("list_sizes") = std::vector<int64_t>());
  m.def("advance_adam_steps", &lazy_mlir::advanceAdamSteps,
        "Adam's step_t += 1 on CPU step counts, and its per-step scalars per distinct count as lazy "
        "tensors, with each count's index (adam_scalars.h).",
        py::arg("state_steps"), py::arg("lr"), py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"),
        py::arg("device"));
  m.def("adam_step_scalars", &lazy_mlir::adamStepScalars, py::arg("step"), py::arg("lr"), py::arg("weight_decay"),
        py::arg("beta1"), py::arg("beta2"));
  py::class_<lazy_mlir::Region, std::shared_ptr<lazy_mlir::Region>>(m, "Region")
      .def_property_readonly("name", [](const lazy_mlir::Region& r) { return r.name; })
      .def_property_readonly("num_ops", [](const lazy_mlir::Region& r) { return r.ops.size(); });
  m.def("make_region", &lazy_mlir::makeRegion, "Record a sequence of aten ops to replay as one IR node (region_node.h).",
        py::arg("name"), py::arg("num_inputs"), py::arg("ops"), py::arg("outputs"), py::arg("output_shapes"));
  m.def("trace_region", &lazy_mlir::traceRegion, "Trace a recorded region over lazy tensors as one IR node.",
        py::arg("region"), py::arg("inputs"));
  py::class_<lazy_mlir::SavedValues, std::shared_ptr<lazy_mlir::SavedValues>>(
      m, "SavedValues", "What a forward region saves for its backward region (region_node.h).")
      .def("__len__", &lazy_mlir::SavedValues::size)
      .def_property_readonly("released", &lazy_mlir::SavedValues::released)
      .def("tensors", &lazy_mlir::SavedValues::tensors);
  m.def("trace_region_saving", &lazy_mlir::traceRegionSaving,
        "Trace a forward region: its outputs [saved_begin, saved_end) as SavedValues, the others as tensors.",
        py::arg("region"), py::arg("inputs"), py::arg("saved_begin"), py::arg("saved_end"));
  m.def("replay_backward", &lazy_mlir::replayBackward,
        "A direct replay's backward: the region over a forward's SavedValues, the gradients and constants; "
        "returns each forward input's gradient, the leaves' stored into .grad unless create_graph "
        "(region_node.h).", py::arg("region"), py::arg("saved"), py::arg("grads"), py::arg("constants"),
        py::arg("positions"), py::arg("create_graph"));
  m.def("store_leaf_grads", &lazy_mlir::storeLeafGrads, pybind11::arg("leaves"), pybind11::arg("grads"),
        "In a backward(): each leaf's gradient stored into its .grad where AccumulateGrad would store it as is "
        "(None returned in its place), the others returned (see leaf_grads.h).");
  m.def("state_signature", &lazy_mlir::stateSignature, pybind11::arg("tensors"),
        "A captured module's state tensors' dtypes, sizes and requires_grad as bytes, None if one is not lazy "
        "(see state_signature.h).");
  py::class_<lazy_mlir::StateEntries>(m, "StateEntries",
                                      "Whether a module tree still holds what a walk of it found (see "
                                      "state_signature.h).")
      .def(py::init<const py::list&, const py::list&>(), py::arg("dicts"), py::arg("entries"))
      .def("unchanged", &lazy_mlir::StateEntries::unchanged);
  m.def(
      "clear_computation_cache", [] { torch::lazy::LazyGraphExecutor::Get()->ClearComputationCache(); },
      "Forget LTC's cached computations: a graph seen before is looked up and compiled as in a new process "
      "(tests that clear lazy_mlir's own state too).");
  m.def(
      "bound_computation_cache", [](int entries) { FLAGS_torch_lazy_compilation_cache_size = entries; },
      py::arg("entries"),
      "The most step graphs LTC keeps compiled (its LRU computation cache). LTC sizes the cache from this "
      "flag when it makes it, at the first sync: later calls change nothing.");
  m.def(
      "computation_cache_entries", [] { return torch::lazy::LazyGraphExecutor::Get()->GetComputationCache()->Numel(); },
      "How many step graphs LTC keeps compiled now.");
  m.def("group_tensors_unfusable", &lazy_mlir::groupTensorsUnfusable, pybind11::arg("params"),
        pybind11::arg("state_steps"),
        "Why a fused optimizer group's tensors keep torch's path, or None (see optimizer_checks.h).");
  m.def("collect_adam_group", &lazy_mlir::collectAdamGroup, py::arg("params"), py::arg("state"), py::arg("amsgrad"),
        py::arg("params_with_grad"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"),
        py::arg("max_exp_avg_sqs"), py::arg("state_steps"),
        "Adam._init_group's lists for a group whose states all exist: has_complex, or None with the lists "
        "untouched (see optimizer_checks.h).");
  m.def("register_fill_kernels", &lazy_mlir::registerFillKernels,
        "Lazy kernels for ones_like, zeros_like, full_like, zero and zero_ (an expanded scalar), slice_backward and "
        "select_backward (see fill_kernels.h).");
  m.def("register_strided_kernels", &lazy_mlir::registerStridedKernels,
        "as_strided_ (a metadata change) and empty_strided (spanning its strides) on the Lazy key "
        "(ltc_fixes/strided_kernels.h).");
  m.def("register_batch_norm_kernel", &lazy_mlir::registerBatchNormKernel,
        "A Lazy kernel for a training native_batch_norm that traces its running statistics' update (see "
        "batch_norm_kernel.h).");
  m.def("front_builtin_kernels", &lazy_mlir::frontBuiltinKernels, py::arg("qualified_names"),
        "C++ fronts over these ops' Python builtin kernels: a call signature seen once builds its node in C++ "
        "(see kernel_fronts.h).");
  m.def("front_composite_kernels", &lazy_mlir::frontCompositeKernels, py::arg("qualified_names"),
        "C++ fronts over these ops' Python composite kernels, which redispatch to the composite kernel once "
        "set_composite_direct says so (see kernel_fronts.h).");
  m.def("set_composite_direct", &lazy_mlir::setCompositeDirect, py::arg("qualified_name"), py::arg("direct"));
  m.def("inside_direct_composite", &lazy_mlir::insideDirectComposite,
        "Whether this thread runs a composite kernel that a C++ front called directly.");
  m.def("register_lazy_autocast", &lazy_mlir::registerLazyAutocast, py::arg("policies"),
        "Cast kernels for torch.autocast(\"lazy\") (lazy_autocast.h).");
  m.def("set_lazy_autocast_enabled", &lazy_mlir::setLazyAutocastEnabled, py::arg("enabled"));
  m.def("lazy_autocast_enabled", &lazy_mlir::lazyAutocastEnabled);
  m.def("set_lazy_autocast_dtype", &lazy_mlir::setLazyAutocastDtype, py::arg("dtype"));
  m.def("lazy_autocast_dtype", &lazy_mlir::lazyAutocastDtype);
  m.def("set_lazy_autocast_default_dtype", &lazy_mlir::setLazyAutocastDefaultDtype, py::arg("dtype"));
  m.def("register_safe_softmax_kernel", &lazy_mlir::registerSafeSoftmaxKernel,
        "A Lazy kernel for _safe_softmax ending in the functional where (see safe_softmax_kernel.h).");
  m.def("register_value_read_kernels", &lazy_mlir::registerValueReadKernels,
        "A Lazy kernel for _local_scalar_dense that syncs every live tensor first when the value read depends on "
        "random draws (see value_reads.h).");
  m.def("sync_live_tensors_before_read", &lazy_mlir::syncLiveTensorsBeforeRead, py::arg("tensors"),
        "Sync every live tensor if one of `tensors` is pending on random draws (value_reads.h); returns whether.");
  m.def("value_key", &lazy_mlir::valueKey, py::arg("tensor"),
        "What a lazy tensor's value is computed from, as a key (0: none); equal keys of live tensors, equal "
        "values (value_reads.h).");
  m.def("sync_live_tensors", &lazy_mlir::syncLiveTensorsOf, py::arg("tensor"),
        "Sync every live tensor of `tensor`'s device, as mark_step does but without ending the step.");
  m.def("register_meta_kernels", &lazy_mlir::registerMetaKernels,
        "C++ Meta kernels for these in-place pointwise aten ops and empty_like (see meta_kernels.h).");
  m.def("install_source_locations", &lazy_mlir::installSourceLocations,
        "Record on traced ops their trace order and, with record_frames, the innermost user frame "
        "(skipping files under the given prefixes).",
        py::arg("internal_prefixes"), py::arg("record_frames"));
  m.def("set_random_ops", &lazy_mlir::setRandomOps,
        "The op kinds that draw from a random generator: kept in trace order (draw_order.h).");
  m.def("mark_layer_boundary", &lazy_mlir::markLayerBoundary,
        "A layer of the model starts or ends here: no fusion group spans it (layer_regions.h).");
  m.def("install_dead_draws", &lazy_mlir::installDeadDraws,
        "Run random ops whose results nothing uses at the next sync of every live tensor, as eager does "
        "(dead_draws.h).");
  m.def("keep_dead_draws", &lazy_mlir::keepDeadDraws,
        "A captured region's outputs that are draws nothing reads: run at the next sync of every live tensor, as "
        "eager runs them (dead_draws.h).");
  m.def("draw_position", &lazy_mlir::drawPosition,
        "(step, position of the next draw in its stream): the lazy device's random state (draw_stream.h).");
  m.def("set_draw_position", &lazy_mlir::setDrawPosition, py::arg("step"), py::arg("position"),
        "The next draws replay the step's stream from `position` (draw_stream.h).");
  m.def("set_device_data_pool", &lazy_mlir::setDeviceDataPool,
        "Recycle device-data nodes nothing holds any more (device_data_pool.h; on by default).", py::arg("on"));
  m.def("nodes_built", &lazy_mlir::nodesBuilt, "IR nodes built so far.");
  // LTC calls the frame function (source_locations.h) only with this flag.
  m.def("set_ltc_ir_debug", [](bool on) { FLAGS_torch_lazy_ir_debug = on; });
  m.def("functional_bases", &lazy_mlir::functionalBases);
  m.def("functional_values", &lazy_mlir::functionalValues,
        "The lazy tensors under functionalized ones, pending updates applied (functional_update.h).");
  m.def("functional_replace", &lazy_mlir::functionalReplace,
        "Updates functionalized tensors in place to the given lazy values (functional_update.h).",
        py::arg("targets"), py::arg("values"));
  m.def("write_lazy", &lazy_mlir::writeLazy, "A lazy tensor takes another's value (functional_update.h).",
        py::arg("target"), py::arg("value"));
  m.def("trace_update", &lazy_mlir::traceUpdate,
        "Trace an op as one node and write its results into functionalized tensors (functional_update.h).",
        py::arg("qualified_name"), py::arg("overload"), py::arg("args"), py::arg("targets"), py::arg("list_sizes"));
  m.def("share_base_buffers", &lazy_mlir::shareBaseBuffers);
  m.def("own_buffers", &lazy_mlir::ownBuffers);
  m.def("device_data_ptr", [](const at::Tensor& tensor) -> int64_t {
    // The address of the buffer behind a synced lazy tensor's data, 0 when it
    // has none (pending or never synced): tests and benchmarks see whether a
    // step wrote a state tensor into its own storage (buffer_donation.h).
    at::Tensor inner = tensor;
    if (at::functionalization::impl::isFunctionalTensor(tensor)) {
      at::functionalization::impl::sync(tensor);
      inner = at::functionalization::impl::from_functional_tensor(tensor);
    }
    auto lazy = torch::lazy::TryGetLtcTensor(inner);
    torch::lazy::BackendDataPtr handle = lazy ? lazy->CurrentDataHandle() : nullptr;
    auto* ts = dynamic_cast<torch::lazy::TSData*>(handle.get());
    if (ts == nullptr || !ts->HasValue()) return 0;
    return reinterpret_cast<int64_t>(ts->data().data_ptr());
  }, py::arg("tensor"));
  m.def("adopt_as_device_data", [](const at::Tensor& tensor) -> at::Tensor {
    // A lazy tensor whose device data is `tensor`'s own buffer. LTC's
    // .to("lazy") copies a host tensor and copies it again when it is first
    // traced (the TorchScript backend's transfer compares cpu with cpu:0):
    // three buffers for a moment. For a tensor that the caller made and
    // hands over (an optimizer's first state), one.
    TORCH_CHECK(tensor.is_contiguous() && !tensor.is_lazy(), "adopt_as_device_data: a contiguous tensor of the backing device");
    const torch::lazy::BackendDevice device = torch::lazy::atenDeviceToBackendDevice(c10::Device(c10::kLazy, 0));
    auto data = std::make_shared<torch::lazy::TSData>(tensor, torch::lazy::Shape(tensor.scalar_type(), tensor.sizes()),
                                                      device);
    at::Tensor lazy = torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(std::move(data)));
    return at::functionalization::impl::to_functional_tensor(lazy);
  }, py::arg("tensor"));
  m.def("stats", [] { return lazy_mlir::RunStats::get().snapshot(); });
  m.def("reset_stats", [] { lazy_mlir::RunStats::get().reset(); });
}
