// RUN: lazy-mlir-opt %s -p zero-reduce-grads --split-input-file | filecheck %s
// RUN: lazy-mlir-opt %s -p "zero-reduce-grads{all-reduce=true}" --split-input-file | filecheck %s --check-prefix=AR

// A 3x2 gradient's mean over 3 ranks, rank 1's shard (2 elements, no pad),
// and a whole (rank -1) gradient. Each collective starts where its marker
// was; its wait sits just before the first use, after unrelated compute.

// CHECK-LABEL: func.func @step
// CHECK:         %[[FLAT:.*]] = torch.aten.reshape %arg0, %{{.*}} -> !torch.vtensor<[6],f32>
// CHECK-NEXT:    %[[RS:.*]] = torch.operator "torch._c10d_functional.reduce_scatter_tensor"(%[[FLAT]], %{{.*}}, %{{.*}}, %{{.*}}) : (!torch.vtensor<[6],f32>, !torch.str, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
// CHECK:         %[[ALLRED:.*]] = torch.operator "torch._c10d_functional.all_reduce"(%arg2, %{{.*}}, %{{.*}}) : (!torch.vtensor<[2],f32>, !torch.str, !torch.str) -> !torch.vtensor<[2],f32>
// CHECK-NEXT:    %[[X:.*]] = torch.aten.mul.Tensor %arg1, %arg1
// CHECK-NEXT:    %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[RS]])
// CHECK:         %[[MEAN:.*]] = torch.aten.div.Scalar %[[W]], %{{.*}}
// CHECK-NEXT:    %[[Y:.*]] = torch.aten.add.Tensor %[[X]], %[[MEAN]]
// CHECK-NEXT:    %[[W2:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[ALLRED]])
// CHECK:         %[[MEAN2:.*]] = torch.aten.div.Scalar %[[W2]]
// CHECK-NEXT:    return %[[Y]], %[[MEAN2]]
// CHECK-NOT:     lazy_mlir.reduce_grad

// ZeRO-1: all-reduce the flat gradient, then keep rank 1's slice [2, 4).
// AR-LABEL: func.func @step
// AR:         %[[ALL:.*]] = torch.operator "torch._c10d_functional.all_reduce"(%{{.*}}) : (!torch.vtensor<[6],f32>, !torch.str, !torch.str) -> !torch.vtensor<[6],f32>
// AR:         %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[ALL]])
// AR-NEXT:    %[[D0:.*]] = torch.constant.int 0
// AR-NEXT:    %[[LO:.*]] = torch.constant.int 2
// AR-NEXT:    %[[HI:.*]] = torch.constant.int 4
// AR-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// AR-NEXT:    torch.aten.slice.Tensor %[[W]], %[[D0]], %[[LO]], %[[HI]], %[[ONE]] : !torch.vtensor<[6],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2],f32>
// AR-NOT:     reduce_scatter
func.func @step(%g: !torch.vtensor<[3,2],f32>, %s: !torch.vtensor<[2],f32>, %h: !torch.vtensor<[2],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>) {
  %int3 = torch.constant.int 3
  %int1 = torch.constant.int 1
  %intm1 = torch.constant.int -1
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int3, %str, %int1) : (!torch.vtensor<[3,2],f32>, !torch.int, !torch.str, !torch.int) -> !torch.vtensor<[2],f32>
  %r2 = torch.operator "torch.lazy_mlir.reduce_grad"(%h, %int3, %str, %intm1) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.int) -> !torch.vtensor<[2],f32>
  %x = torch.aten.mul.Tensor %s, %s : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %y = torch.aten.add.Tensor %x, %r, %int1 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
  return %y, %r2 : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>
}

// -----

// 5 elements over 2 ranks: padded to 6 before the reduce-scatter.
// CHECK-LABEL: func.func @padded
// CHECK:         torch.aten.constant_pad_nd %{{.*}} -> !torch.vtensor<[6],f32>
// CHECK:         torch.operator "torch._c10d_functional.reduce_scatter_tensor"{{.*}} -> !torch.vtensor<[3],f32>
func.func @padded(%g: !torch.vtensor<[5],f32>) -> !torch.vtensor<[3],f32> {
  %int2 = torch.constant.int 2
  %int0 = torch.constant.int 0
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %str, %int0) : (!torch.vtensor<[5],f32>, !torch.int, !torch.str, !torch.int) -> !torch.vtensor<[3],f32>
  return %r : !torch.vtensor<[3],f32>
}
