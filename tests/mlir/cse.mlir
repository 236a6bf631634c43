// RUN: lazy-mlir-opt %s -p cse --split-input-file | filecheck %s

// Equal constants and lists merge, unused ones go.

// CHECK-LABEL: func.func @merges_constants_and_lists
// CHECK-NEXT:    %[[INT16:.*]] = torch.constant.int 16
// CHECK-NEXT:    %[[SIZE:.*]] = torch.prim.ListConstruct %[[INT16]]
// CHECK-NEXT:    %[[A:.*]] = torch.aten.reshape %arg0, %[[SIZE]]
// CHECK-NEXT:    %[[B:.*]] = torch.aten.reshape %arg0, %[[SIZE]]
// CHECK-NEXT:    return %[[A]], %[[B]]
func.func @merges_constants_and_lists(%arg0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[16],f32>, !torch.vtensor<[16],f32>) {
  %int16 = torch.constant.int 16
  %int16_0 = torch.constant.int 16
  %int7 = torch.constant.int 7
  %0 = torch.prim.ListConstruct %int16 : (!torch.int) -> !torch.list<int>
  %1 = torch.prim.ListConstruct %int16_0 : (!torch.int) -> !torch.list<int>
  %2 = torch.aten.reshape %arg0, %0 : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
  %3 = torch.aten.reshape %arg0, %1 : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
  return %2, %3 : !torch.vtensor<[16],f32>, !torch.vtensor<[16],f32>
}

// -----

// torch-mlir does not mark aten ops side-effect free: equal ones stay.

// CHECK-LABEL: func.func @keeps_equal_aten_ops
// CHECK-COUNT-2: torch.aten.t %arg0
func.func @keeps_equal_aten_ops(%arg0: !torch.vtensor<[4,3],f32>) -> (!torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>) {
  %0 = torch.aten.t %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %1 = torch.aten.t %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %0, %1 : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>
}
