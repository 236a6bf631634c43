// RUN: lazy-mlir-opt %s -p zero-insert-gather --split-input-file | filecheck %s
// RUN: lazy-mlir-opt %s -p "zero-insert-gather{regather=false}" --split-input-file | filecheck %s --check-prefix=ONCE
// RUN: lazy-mlir-opt %s -p zero-insert-gather --split-input-file | filecheck %s --check-prefix=GONE
// RUN: lazy-mlir-opt %s -p "zero-insert-gather{reuse-bytes=8}" --split-input-file | filecheck %s --check-prefix=REUSE
// RUN: lazy-mlir-opt %s -p "zero-insert-gather{reuse-bytes=7}" --split-input-file | filecheck %s --check-prefix=NOREUSE

// GONE-NOT: lazy_mlir.unshard

// A weight w of 3x2 (2 ranks hold 4 elements each: 8, sliced back to 6)
// is used in forward (mm with
// its transpose), then a bias b is used, then w is used again in backward
// through a value derived from it (t(t(w))). With regather, w is gathered
// twice, each time just before its phase's first use, and the derived
// transposes are recomputed from the second gather: nothing from the first
// gather is used after b's use.

// CHECK-LABEL: func.func @forward_backward
// CHECK:         %[[G1:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0, %{{.*}}, %{{.*}}) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
// CHECK-NEXT:    %[[W1:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[G1]])
// CHECK:         %[[S1:.*]] = torch.aten.slice.Tensor %[[W1]], {{.*}} -> !torch.vtensor<[6],f32>
// CHECK-NEXT:    %[[V1:.*]] = torch.aten.view %[[S1]], {{.*}} -> !torch.vtensor<[3,2],f32>
// CHECK-NEXT:    %[[T1:.*]] = torch.aten.t %[[V1]]
// CHECK-NEXT:    %[[Y:.*]] = torch.aten.mm %arg2, %[[T1]]
// CHECK:         torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg1,
// CHECK:         torch.aten.add.Tensor %arg2
// CHECK-NEXT:    %[[G2:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0,
// CHECK-NEXT:    %[[W2:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[G2]])
// CHECK:         %[[S2:.*]] = torch.aten.slice.Tensor %[[W2]]
// CHECK-NEXT:    %[[V2:.*]] = torch.aten.view %[[S2]]
// CHECK-NEXT:    %[[T2:.*]] = torch.aten.t %[[V2]]
// CHECK-NEXT:    %[[TT2:.*]] = torch.aten.t %[[T2]]
// CHECK-NEXT:    %[[G:.*]] = torch.aten.mm %[[Y]], %[[TT2]]
// CHECK-NOT:     %[[V1]]
// CHECK:         return %[[Y]], %[[G]]

// b's gathered 2 floats (8 bytes) fit a reuse budget of 8 bytes: w's first
// gather serves its backward use too. A budget of 7 bytes does not keep it.
// REUSE-LABEL: func.func @forward_backward
// REUSE-COUNT-2: all_gather_into_tensor
// REUSE-NOT:     all_gather_into_tensor
// REUSE-LABEL: func.func @updated_parameter
// NOREUSE-LABEL: func.func @forward_backward
// NOREUSE-COUNT-3: all_gather_into_tensor
// NOREUSE-LABEL: func.func @updated_parameter

// Without regather (ZeRO-1/2), one gather serves all uses.
// ONCE-LABEL: func.func @forward_backward
// ONCE-COUNT-2: all_gather_into_tensor
// ONCE-NOT:     all_gather_into_tensor
func.func @forward_backward(%w: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[1],f32>, %x: !torch.vtensor<[3,2],f32>) -> (!torch.vtensor<[3,3],f32>, !torch.vtensor<[3,2],f32>) {
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %int1 = torch.constant.int 1
  %str = torch.constant.str "0"
  %shape = torch.prim.ListConstruct %int3, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %bshape = torch.prim.ListConstruct %int2 : (!torch.int) -> !torch.list<int>
  %full = torch.operator "torch.lazy_mlir.unshard"(%w, %shape, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[3,2],f32>
  %bfull = torch.operator "torch.lazy_mlir.unshard"(%b, %bshape, %int2, %str) : (!torch.vtensor<[1],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  %wt = torch.aten.t %full : !torch.vtensor<[3,2],f32> -> !torch.vtensor<[2,3],f32>
  %y = torch.aten.mm %x, %wt : !torch.vtensor<[3,2],f32>, !torch.vtensor<[2,3],f32> -> !torch.vtensor<[3,3],f32>
  %z = torch.aten.add.Tensor %x, %bfull, %int1 : !torch.vtensor<[3,2],f32>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[3,2],f32>
  %wtt = torch.aten.t %wt : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[3,2],f32>
  %g = torch.aten.mm %y, %wtt : !torch.vtensor<[3,3],f32>, !torch.vtensor<[3,2],f32> -> !torch.vtensor<[3,2],f32>
  return %y, %g : !torch.vtensor<[3,3],f32>, !torch.vtensor<[3,2],f32>
}

// -----

// ZeRO-1/2: the updated shard is gathered back into the whole parameter the
// step returns; no padding (4 elements over 2 ranks) means no slice, a 1-D
// parameter needs no view.
// CHECK-LABEL: func.func @updated_parameter
// ONCE-LABEL:  func.func @updated_parameter
// CHECK:         %[[U:.*]] = torch.aten.mul.Tensor %arg0, %arg0
// CHECK-NEXT:    %[[G:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%[[U]], %{{.*}}, %{{.*}}) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str) -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[G]])
// CHECK-NEXT:    return %[[W]]
func.func @updated_parameter(%shard: !torch.vtensor<[2],f32>) -> !torch.vtensor<[4],f32> {
  %int4 = torch.constant.int 4
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %shape = torch.prim.ListConstruct %int4 : (!torch.int) -> !torch.list<int>
  %new = torch.aten.mul.Tensor %shard, %shard : !torch.vtensor<[2],f32>, !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  %full = torch.operator "torch.lazy_mlir.unshard"(%new, %shape, %int2, %str) : (!torch.vtensor<[2],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[4],f32>
  return %full : !torch.vtensor<[4],f32>
}

// -----

// Autocast: the forward and backward read the float32 weight only through
// its cast to bfloat16. Each phase gathers the shard cast (made once, at
// the function's start, so that a gather can be issued early): 8 bf16
// elements instead of 8 f32. The cast op of the full weight is gone.
// CHECK-LABEL: func.func @autocast_weight
// CHECK:         %[[C:.*]] = torch.aten._to_copy %arg0, %{{.*}} : !torch.vtensor<[4],f32>, {{.*}} -> !torch.vtensor<[4],bf16>
// CHECK:         %[[G1:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%[[C]], %{{.*}}, %{{.*}}) : (!torch.vtensor<[4],bf16>, !torch.int, !torch.str) -> !torch.vtensor<[8],bf16>
// CHECK-NEXT:    %[[W1:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[G1]])
// CHECK:         %[[S1:.*]] = torch.aten.slice.Tensor %[[W1]], {{.*}} -> !torch.vtensor<[6],bf16>
// CHECK-NEXT:    %[[V1:.*]] = torch.aten.view %[[S1]], {{.*}} -> !torch.vtensor<[3,2],bf16>
// CHECK-NEXT:    %[[T1:.*]] = torch.aten.t %[[V1]]
// CHECK-NEXT:    %[[Y:.*]] = torch.aten.mm %arg2, %[[T1]]
// CHECK:         torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg1,
// CHECK:         %[[G2:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%[[C]], {{.*}} -> !torch.vtensor<[8],bf16>
// CHECK-NOT:     _to_copy
// CHECK:         return
// The f32 weight also read directly (an f32 use beside the cast): gathered in f32.
// ONCE-LABEL: func.func @autocast_weight
// ONCE:         torch.operator "torch._c10d_functional.all_gather_into_tensor"(%{{.*}}) : (!torch.vtensor<[4],bf16>, !torch.int, !torch.str)
// ONCE-LABEL: func.func @weight_read_in_both_precisions
// ONCE:         torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0, %{{.*}}, %{{.*}}) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str)
// ONCE:         torch.aten._to_copy %{{.*}} : !torch.vtensor<[3,2],f32>, {{.*}} -> !torch.vtensor<[3,2],bf16>
func.func @autocast_weight(%w: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[1],f32>, %x: !torch.vtensor<[3,2],bf16>) -> (!torch.vtensor<[3,3],bf16>, !torch.vtensor<[3,2],bf16>) {
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %int1 = torch.constant.int 1
  %int15 = torch.constant.int 15
  %none = torch.constant.none
  %false = torch.constant.bool false
  %str = torch.constant.str "0"
  %shape = torch.prim.ListConstruct %int3, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %bshape = torch.prim.ListConstruct %int2 : (!torch.int) -> !torch.list<int>
  %full = torch.operator "torch.lazy_mlir.unshard"(%w, %shape, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[3,2],f32>
  %bfull = torch.operator "torch.lazy_mlir.unshard"(%b, %bshape, %int2, %str) : (!torch.vtensor<[1],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  %half = torch.aten._to_copy %full, %int15, %none, %none, %none, %false, %none : !torch.vtensor<[3,2],f32>, !torch.int, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> !torch.vtensor<[3,2],bf16>
  %wt = torch.aten.t %half : !torch.vtensor<[3,2],bf16> -> !torch.vtensor<[2,3],bf16>
  %y = torch.aten.mm %x, %wt : !torch.vtensor<[3,2],bf16>, !torch.vtensor<[2,3],bf16> -> !torch.vtensor<[3,3],bf16>
  %z = torch.aten.add.Tensor %x, %bfull, %int1 : !torch.vtensor<[3,2],bf16>, !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[3,2],f32>
  %wtt = torch.aten.t %wt : !torch.vtensor<[2,3],bf16> -> !torch.vtensor<[3,2],bf16>
  %g = torch.aten.mm %y, %wtt : !torch.vtensor<[3,3],bf16>, !torch.vtensor<[3,2],bf16> -> !torch.vtensor<[3,2],bf16>
  return %y, %g : !torch.vtensor<[3,3],bf16>, !torch.vtensor<[3,2],bf16>
}

// -----

func.func @weight_read_in_both_precisions(%w: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[3,2],bf16>, !torch.vtensor<[3,2],f32>) {
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %int15 = torch.constant.int 15
  %none = torch.constant.none
  %false = torch.constant.bool false
  %str = torch.constant.str "0"
  %shape = torch.prim.ListConstruct %int3, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %full = torch.operator "torch.lazy_mlir.unshard"(%w, %shape, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[3,2],f32>
  %half = torch.aten._to_copy %full, %int15, %none, %none, %none, %false, %none : !torch.vtensor<[3,2],f32>, !torch.int, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> !torch.vtensor<[3,2],bf16>
  %sq = torch.aten.mul.Tensor %full, %full : !torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32> -> !torch.vtensor<[3,2],f32>
  return %half, %sq : !torch.vtensor<[3,2],bf16>, !torch.vtensor<[3,2],f32>
}

// -----

// A cast that asks for more than a dtype (non_blocking here) is not rebuilt
// on the shard: the weight gathers in f32 and is cast as written.
// ONCE-LABEL: func.func @cast_with_other_options
// ONCE:         torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0, %{{.*}}, %{{.*}}) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str)
func.func @cast_with_other_options(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[3,2],bf16> {
  %int3 = torch.constant.int 3
  %int2 = torch.constant.int 2
  %int15 = torch.constant.int 15
  %none = torch.constant.none
  %true = torch.constant.bool true
  %str = torch.constant.str "0"
  %shape = torch.prim.ListConstruct %int3, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %full = torch.operator "torch.lazy_mlir.unshard"(%w, %shape, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.list<int>, !torch.int, !torch.str) -> !torch.vtensor<[3,2],f32>
  %half = torch.aten._to_copy %full, %int15, %none, %none, %none, %true, %none : !torch.vtensor<[3,2],f32>, !torch.int, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> !torch.vtensor<[3,2],bf16>
  return %half : !torch.vtensor<[3,2],bf16>
}
