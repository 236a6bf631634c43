#include "ltc_fixes/dropout_masks.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

namespace lazy_mlir {

namespace {

const c10::Symbol kNativeDropout = c10::Symbol::aten("native_dropout");
const c10::Symbol kSizes = c10::Symbol::attr("dropout_sizes");
const c10::Symbol kDtype = c10::Symbol::attr("dropout_dtype");
const c10::Symbol kDevice = c10::Symbol::attr("dropout_device");

void untag(torch::jit::Node* n) {
  for (c10::Symbol name : {kSizes, kDtype, kDevice}) {
    if (n->hasAttribute(name)) n->removeAttribute(name);
  }
}

// native_dropout's `train` (bool?): training unless a constant false.
bool training(torch::jit::Value* train) {
  const auto value = torch::jit::toIValue(train);
  if (!value) return false;  // not known at compile time: leave the op whole
  return value->isNone() || value->toBool();
}

// The mask native_dropout draws for a tensor of these sizes and dtype; the
// values it drops (an empty tensor's) are not read for the mask.
at::Tensor dropoutMask(c10::IntArrayRef sizes, c10::ScalarType dtype, double p, c10::Device device) {
  at::Tensor like = at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
  return std::get<1>(at::native_dropout(like, p, true));
}

TORCH_LIBRARY_FRAGMENT(lazy_mlir, m) {
  m.def("dropout_mask(int[] sizes, ScalarType dtype, float p, Device device) -> Tensor", &dropoutMask);
}

}  // namespace

void tagDropout(const torch::lazy::Node& node, torch::jit::Node* lowered, c10::DeviceType glue_device) {
  if (node.op().op == kNativeDropout && !node.shapes().empty()) tagDropout(lowered, node.shape(0), glue_device);
}

void tagDropout(torch::jit::Node* lowered, const torch::lazy::Shape& shape, c10::DeviceType glue_device) {
  if (lowered->kind() != kNativeDropout) return;
  lowered->is_(kSizes, shape.sizes().vec());
  lowered->i_(kDtype, static_cast<int64_t>(shape.scalar_type()));
  lowered->s_(kDevice, c10::Device(glue_device).str());
}

void splitDropoutMasks(torch::jit::Graph& graph, const std::function<bool(torch::jit::Node*)>& in_glue) {
  static const c10::Symbol mask_op = c10::Symbol::fromQualString("lazy_mlir::dropout_mask");
  static const c10::Symbol mul = c10::Symbol::aten("mul");
  std::vector<torch::jit::Node*> dropouts;
  for (torch::jit::Node* n : graph.nodes()) {
    if (n->kind() == kNativeDropout && n->hasAttribute(kSizes)) dropouts.push_back(n);
  }
  for (torch::jit::Node* n : dropouts) {
    const auto probability = torch::jit::toIValue(n->input(1));
    if (!in_glue(n) || !training(n->input(2)) || !probability) {  // (LTC's p is a constant)
      untag(n);
      continue;
    }
    torch::jit::WithInsertPoint here(n);
    const double p = probability->toDouble();
    torch::jit::Value* sizes = graph.insertConstant(n->is(kSizes));
    torch::jit::Value* dtype = graph.insertConstant(n->i(kDtype));
    torch::jit::Value* device = graph.insertConstant(c10::Device(n->s(kDevice)));
    torch::jit::Node* mask = graph.insertNode(graph.create(mask_op, {sizes, dtype, n->input(1), device}));
    // native_dropout's output: input * mask * (1 / (1 - p)), as its kernel computes it
    torch::jit::Node* masked = graph.insertNode(graph.create(mul, {n->input(0), mask->output()}));
    const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
    torch::jit::Node* scaled = graph.insertNode(graph.create(mul, {masked->output(), graph.insertConstant(scale)}));
    untag(n);
    for (torch::jit::Node* added : {mask, masked, scaled}) {
      added->copyAttributes(*n);  // the source line, the layer region
      added->output()->setType(c10::TensorType::get());
    }
    n->output(0)->replaceAllUsesWith(scaled->output());
    n->output(1)->replaceAllUsesWith(mask->output());
    n->destroy();
  }
}

}  // namespace lazy_mlir
