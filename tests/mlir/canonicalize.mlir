// RUN: lazy-mlir-opt %s -p canonicalize --split-input-file | filecheck %s
// RUN: lazy-mlir-opt %s -p "canonicalize{max-iterations=2,top-down=false}" --split-input-file | filecheck %s

// No-op aten ops fold into their operand; equal constants merge.

// CHECK-LABEL: func.func @folds_no_ops
// CHECK-NEXT:    return %arg0, %arg0, %arg0, %arg0 :
func.func @folds_no_ops(%arg0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) {
  %int4 = torch.constant.int 4
  %int4_0 = torch.constant.int 4
  %none = torch.constant.none
  %size = torch.prim.ListConstruct %int4, %int4_0 : (!torch.int, !torch.int) -> !torch.list<int>
  %0 = torch.aten.reshape %arg0, %size : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[4,4],f32>
  %1 = torch.aten.broadcast_to %arg0, %size : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[4,4],f32>
  %2 = torch.aten.clone %arg0, %none : !torch.vtensor<[4,4],f32>, !torch.none -> !torch.vtensor<[4,4],f32>
  %3 = torch.aten.alias %arg0 : !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  return %0, %1, %2, %3 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>
}

// -----

// Why canonicalize is not in DEFAULT_PIPELINE: a constant-shaped aten.zeros
// becomes torch.vtensor.literal, which has no ATen op to export to.

// CHECK-LABEL: func.func @zeros_become_a_literal
// CHECK-NEXT:    %[[ZEROS:.*]] = torch.vtensor.literal(dense<0.000000e+00> : tensor<2x3xf32>) : !torch.vtensor<[2,3],f32>
// CHECK-NEXT:    return %[[ZEROS]]
// CHECK-NOT:     torch.aten.zeros
func.func @zeros_become_a_literal() -> !torch.vtensor<[2,3],f32> {
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int6 = torch.constant.int 6
  %none = torch.constant.none
  %size = torch.prim.ListConstruct %int2, %int3 : (!torch.int, !torch.int) -> !torch.list<int>
  %0 = torch.aten.zeros %size, %int6, %none, %none, %none : !torch.list<int>, !torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[2,3],f32>
  return %0 : !torch.vtensor<[2,3],f32>
}
