// RUN: lazy-mlir-opt %s -p specialize-scalars --split-input-file | filecheck %s

// A threshold with no tensor form becomes a constant; the argument is marked.

// CHECK-LABEL: func.func @threshold
// CHECK-SAME:    %arg2: !torch.vtensor<[],si64> {lazy_mlir.specialized, lazy_mlir.value = 0 : i64}
// CHECK-NEXT:    %[[C:.*]] = torch.constant.int 0
// CHECK-NEXT:    torch.aten.threshold_backward %arg0, %arg1, %[[C]]
// CHECK-NOT:     ScalarImplicit
func.func @threshold(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],f32>, %arg2: !torch.vtensor<[],si64> {lazy_mlir.value = 0 : i64}) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],si64> -> !torch.int
  %1 = torch.aten.threshold_backward %arg0, %arg1, %0 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}

// -----

// Float values; an argument without a value, or without a ScalarImplicit use, is not marked.

// CHECK-LABEL: func.func @float_and_unmarked
// CHECK-SAME:    %arg1: !torch.vtensor<[],f64> {lazy_mlir.specialized, lazy_mlir.value = 5.000000e-01 : f64}
// CHECK-SAME:    %arg2: !torch.vtensor<[],f64> {lazy_mlir.value = 2.500000e-01 : f64}
// CHECK-SAME:    %arg3: !torch.vtensor<[],f64>)
// CHECK:         %[[C:.*]] = torch.constant.float 5.000000e-01
// CHECK:         torch.aten.leaky_relu %arg0, %[[C]]
// CHECK:         torch.aten.ScalarImplicit %arg3
func.func @float_and_unmarked(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f64> {lazy_mlir.value = 0.5 : f64}, %arg2: !torch.vtensor<[],f64> {lazy_mlir.value = 0.25 : f64}, %arg3: !torch.vtensor<[],f64>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f64> -> !torch.float
  %1 = torch.aten.leaky_relu %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %2 = torch.aten.mul.Tensor %arg0, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f64> -> !torch.vtensor<[4],f32>
  %3 = torch.aten.ScalarImplicit %arg3 : !torch.vtensor<[],f64> -> !torch.float
  %4 = torch.aten.leaky_relu %arg0, %3 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %1, %2, %4 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}
