// RUN: not lazy-mlir-opt %s -p fold-copy-ops --split-input-file 2>&1 | filecheck %s

// Reference semantics (!torch.tensor) would make a view alias the input.

// CHECK: error: fold-copy-ops: 'torch.aten.t_copy' at "-":[[# @LINE + 2]]:8: expects value semantics (!torch.vtensor) but has !torch.tensor<[4,3],f32>
func.func @reference_semantics(%arg0: !torch.tensor<[4,3],f32>) -> !torch.tensor<[3,4],f32> {
  %0 = torch.aten.t_copy %arg0 : !torch.tensor<[4,3],f32> -> !torch.tensor<[3,4],f32>
  return %0 : !torch.tensor<[3,4],f32>
}

// -----

// The generic form of an op without a torch-mlir definition is checked too.

// CHECK: error: fold-copy-ops: 'torch.aten.squeeze_copy.dims' at "-":[[# @LINE + 3]]:8: expects value semantics
func.func @reference_semantics_generic(%arg0: !torch.tensor<[4,1],f32>) -> !torch.tensor<[4],f32> {
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %0 = torch.operator "torch.aten.squeeze_copy.dims"(%arg0, %dims) : (!torch.tensor<[4,1],f32>, !torch.list<int>) -> !torch.tensor<[4],f32>
  return %0 : !torch.tensor<[4],f32>
}

// -----

// A chunk that fails does not stop the others.

// CHECK-LABEL: func.func @still_processed
// CHECK:         torch.aten.t %arg0
func.func @still_processed(%arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %0 : !torch.vtensor<[3,4],f32>
}
