// RUN: not lazy-mlir-opt %s -p verify-markers-lowered --split-input-file 2>&1 | filecheck %s

// A ZeRO marker that no zero pass lowered must not reach code generation.

// CHECK: error: verify-markers-lowered: 'torch.operator' at "-":[[# @LINE + 5]]:8: lazy_mlir marker left after the pipeline
func.func @unlowered(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[6],f32> {
  %shape = torch.prim.ListConstruct : () -> !torch.list<int>
  %world = torch.constant.int 3
  %name = torch.constant.str "0"
  %0 = torch.operator "torch.lazy_mlir.unshard"(%arg0, %shape, %world, %name) : (!torch.vtensor<[2],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[6],f32>
  return %0 : !torch.vtensor<[6],f32>
}

// -----

// Lowered IR passes unchanged.

// CHECK-LABEL: func.func @lowered
// CHECK-NEXT:    torch.aten.mul.Tensor %arg0, %arg0
func.func @lowered(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
  %0 = torch.aten.mul.Tensor %arg0, %arg0 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}
