// RUN: lazy-mlir-opt %s -p zero-hoist-reduces --split-input-file | filecheck %s

// Two layers in LTC's post-order: backward's input-gradient chain (%d1, %d0)
// comes first, then per weight its gradient mm, its reduce_grad marker and
// its update. Each marker moves up with its private ops (the transpose, the
// mm) to just after the gradient it needs: %w1's right after %d1, before %d0
// is computed. Constants go to the top first, so the late %int2 shared by
// both markers does not hold the cones back; the updates stay at the end.

// CHECK-LABEL: func.func @two_layers
// CHECK:         %[[INT2:.*]] = torch.constant.int 2
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[D1:.*]] = torch.aten.mul.Tensor %arg2, %arg2
// CHECK-NEXT:    %[[T1:.*]] = torch.aten.t %[[D1]]
// CHECK-NEXT:    %[[G1:.*]] = torch.aten.mm %[[T1]], %arg0
// CHECK-NEXT:    %[[R1:.*]] = torch.operator "torch.lazy_mlir.reduce_grad"(%[[G1]], %[[INT2]]
// CHECK-NEXT:    %[[D0:.*]] = torch.aten.mm %[[D1]], %arg3
// CHECK-NEXT:    %[[T0:.*]] = torch.aten.t %[[D0]]
// CHECK-NEXT:    %[[G0:.*]] = torch.aten.mm %[[T0]], %arg1
// CHECK-NEXT:    %[[R0:.*]] = torch.operator "torch.lazy_mlir.reduce_grad"(%[[G0]]
// CHECK-NEXT:    torch.aten.add.Tensor %arg3, %[[R1]], %[[ONE]]
// CHECK-NEXT:    torch.aten.add.Tensor %arg4, %[[R0]], %[[ONE]]
func.func @two_layers(%x1: !torch.vtensor<[4,4],f32>, %x0: !torch.vtensor<[4,4],f32>, %dy: !torch.vtensor<[4,4],f32>,
                      %w1: !torch.vtensor<[4,4],f32>, %w0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) {
  %rep1 = torch.constant.int 1
  %whole = torch.constant.bool false
  %norep = torch.constant.str ""
  %str = torch.constant.str "0"
  %d1 = torch.aten.mul.Tensor %dy, %dy : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %d0 = torch.aten.mm %d1, %w1 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %int2 = torch.constant.int 2
  %one = torch.constant.int 1
  %t1 = torch.aten.t %d1 : !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %g1 = torch.aten.mm %t1, %x1 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %r1 = torch.operator "torch.lazy_mlir.reduce_grad"(%g1, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[4,4],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[4,4],f32>
  %u1 = torch.aten.add.Tensor %w1, %r1, %one : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
  %t0 = torch.aten.t %d0 : !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %g0 = torch.aten.mm %t0, %x0 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %r0 = torch.operator "torch.lazy_mlir.reduce_grad"(%g0, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[4,4],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[4,4],f32>
  %u0 = torch.aten.add.Tensor %w0, %r0, %one : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
  return %u1, %u0, %d0 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>
}

// -----

// Two markers ready at the same point keep their order. A value that is
// also returned is not private: %g stays, and the marker moves only after it.
// CHECK-LABEL: func.func @same_point
// CHECK:         %[[A:.*]] = torch.aten.mul.Tensor %arg0, %arg0
// CHECK-NEXT:    %[[RA:.*]] = torch.operator "torch.lazy_mlir.reduce_grad"(%[[A]]
// CHECK-NEXT:    %[[RB:.*]] = torch.operator "torch.lazy_mlir.reduce_grad"(%arg1
// CHECK-NEXT:    %[[X:.*]] = torch.aten.exp %arg0
// CHECK-NEXT:    %[[G:.*]] = torch.aten.neg %arg1
// CHECK-NEXT:    %[[RG:.*]] = torch.operator "torch.lazy_mlir.reduce_grad"(%[[G]]
// CHECK-NEXT:    torch.aten.sin %[[X]]
func.func @same_point(%a: !torch.vtensor<[2],f32>, %b: !torch.vtensor<[2],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>) {
  %rep1 = torch.constant.int 1
  %whole = torch.constant.bool false
  %norep = torch.constant.str ""
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %x = torch.aten.exp %a : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %g = torch.aten.neg %b : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %y = torch.aten.sin %x : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %sq = torch.aten.mul.Tensor %a, %a : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %ra = torch.operator "torch.lazy_mlir.reduce_grad"(%sq, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  %rb = torch.operator "torch.lazy_mlir.reduce_grad"(%b, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  %rg = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  return %ra, %rb, %rg, %y, %g : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>
}
