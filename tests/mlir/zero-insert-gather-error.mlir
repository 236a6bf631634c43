// RUN: not lazy-mlir-opt %s -p zero-insert-gather --split-input-file 2>&1 | filecheck %s

// The gathered shape must be constant: the all-gather's output size depends on it.

// CHECK: error: zero-insert-gather: 'torch.operator' at "-":[[# @LINE + 4]]:8: group size and shape must be constants
func.func @runtime_group_size(%arg0: !torch.vtensor<[2],f32>, %world: !torch.int) -> !torch.vtensor<[6],f32> {
  %shape = torch.prim.ListConstruct : () -> !torch.list<int>
  %name = torch.constant.str "0"
  %0 = torch.operator "torch.lazy_mlir.unshard"(%arg0, %shape, %world, %name) : (!torch.vtensor<[2],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[6],f32>
  %1 = torch.aten.mul.Tensor %0, %0 : !torch.vtensor<[6],f32>, !torch.vtensor<[6],f32> -> !torch.vtensor<[6],f32>
  return %1 : !torch.vtensor<[6],f32>
}

// -----

// Shape-generic groups stay static under ZeRO (shape_generic.enabled): a
// sharded parameter whose full shape is a symbolic size is rejected.

// CHECK: error: zero-insert-gather: 'torch.operator' at "-":[[# @LINE + 7]]:8: group size and shape must be constants
func.func @symbolic_shape(%arg0: !torch.vtensor<[2],f32>, %arg1: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
  %int0 = torch.constant.int 0
  %n = torch.aten.size.int %arg1, %int0 : !torch.vtensor<[?],f32>, !torch.int -> !torch.int
  %shape = torch.prim.ListConstruct %n : (!torch.int) -> !torch.list<int>
  %world = torch.constant.int 3
  %name = torch.constant.str "0"
  %0 = torch.operator "torch.lazy_mlir.unshard"(%arg0, %shape, %world, %name) : (!torch.vtensor<[2],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[?],f32>
  return %0 : !torch.vtensor<[?],f32>
}
