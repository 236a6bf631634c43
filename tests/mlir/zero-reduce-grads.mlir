// RUN: lazy-mlir-opt %s -p zero-reduce-grads --split-input-file | filecheck %s

// A 3x2 gradient's mean over 3 ranks, this rank's shard (2 elements, no
// pad), and a whole gradient. Each collective starts where its marker
// was; its wait sits just before the first use, after unrelated compute.

// CHECK-LABEL: func.func @step
// CHECK:         %[[FLAT:.*]] = torch.aten.reshape %arg0, %{{.*}} -> !torch.vtensor<[6],f32>
// CHECK:         %[[RS:.*]] = torch.operator "torch._c10d_functional.reduce_scatter_tensor"(%[[FLAT]], %{{.*}}, %{{.*}}, %{{.*}}) : (!torch.vtensor<[6],f32>, !torch.str, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
// CHECK:         %[[ALLRED:.*]] = torch.operator "torch._c10d_functional.all_reduce"(%arg2, %{{.*}}, %{{.*}}) : (!torch.vtensor<[2],f32>, !torch.str, !torch.str) -> !torch.vtensor<[2],f32>
// CHECK-NEXT:    %[[X:.*]] = torch.aten.mul.Tensor %arg1, %arg1
// CHECK-NEXT:    %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[RS]])
// CHECK:         %[[MEAN:.*]] = torch.aten.div.Scalar %[[W]], %{{.*}}
// CHECK-NEXT:    %[[Y:.*]] = torch.aten.add.Tensor %[[X]], %[[MEAN]]
// CHECK-NEXT:    %[[W2:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[ALLRED]])
// CHECK:         %[[MEAN2:.*]] = torch.aten.div.Scalar %[[W2]]
// CHECK-NEXT:    return %[[Y]], %[[MEAN2]]
// CHECK-NOT:     lazy_mlir.reduce_grad

// all-to-all: each rank receives the 3 ranks' copies of its 2-element slice
// and adds them up after the wait; the whole gradient keeps its all-reduce.
// RUN: lazy-mlir-opt %s -p "zero-reduce-grads{all-to-all=true}" --split-input-file | filecheck %s --check-prefix=TOALL
// TOALL-LABEL: func.func @step
// TOALL:         %[[FLAT:.*]] = torch.aten.reshape %arg0, %{{.*}} -> !torch.vtensor<[6],f32>
// TOALL:         %[[SPLITS:.*]] = torch.prim.ListConstruct {{.*}} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
// TOALL-NEXT:    %[[SENT:.*]] = torch.operator "torch._c10d_functional.all_to_all_single"(%[[FLAT]], %[[SPLITS]], %[[SPLITS]], %{{.*}}) : (!torch.vtensor<[6],f32>, !torch.list<int>, !torch.list<int>, !torch.str) -> !torch.vtensor<[6],f32>
// TOALL:         torch.operator "torch._c10d_functional.all_reduce"(%arg2
// TOALL:         %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[SENT]])
// TOALL:         %[[COPIES:.*]] = torch.aten.view %[[W]], %{{.*}} -> !torch.vtensor<[3,2],f32>
// TOALL:         %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[COPIES]], %{{.*}}, %{{.*}}, %{{.*}} : !torch.vtensor<[3,2],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[2],f32>
// TOALL:         torch.aten.div.Scalar %[[SUM]]
// TOALL-LABEL: func.func @padded
// TOALL-NOT:     reduce_scatter
func.func @step(%g: !torch.vtensor<[3,2],f32>, %s: !torch.vtensor<[2],f32>, %h: !torch.vtensor<[2],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[2],f32>) {
  %rep1 = torch.constant.int 1
  %sharded = torch.constant.bool true
  %whole = torch.constant.bool false
  %norep = torch.constant.str ""
  %int3 = torch.constant.int 3
  %int1 = torch.constant.int 1
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int3, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[3,2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  %r2 = torch.operator "torch.lazy_mlir.reduce_grad"(%h, %int3, %str, %whole, %rep1, %norep) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
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
  %rep1 = torch.constant.int 1
  %sharded = torch.constant.bool true
  %norep = torch.constant.str ""
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[5],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  return %r : !torch.vtensor<[3],f32>
}

// -----

// Bucketing: two sharded gradients (6 and 5 elements over 2 ranks: shards of
// 3 and 3) share one reduce-scatter, laid out [2 ranks, 3 + 3] side by side,
// started where the second marker was; the whole gradient after
// them is another kind and keeps its own all-reduce.
// RUN: lazy-mlir-opt %s -p "zero-reduce-grads{bucket-bytes=64}" --split-input-file | filecheck %s --check-prefix=BUCKET
// BUCKET-LABEL: func.func @bucketed
// BUCKET:         %[[M:.*]] = torch.aten.mul.Tensor %arg1, %arg1
// BUCKET:         torch.aten.view {{.*}} -> !torch.vtensor<[2,3],f32>
// BUCKET:         torch.aten.constant_pad_nd {{.*}} -> !torch.vtensor<[6],f32>
// BUCKET:         torch.aten.view {{.*}} -> !torch.vtensor<[2,3],f32>
// BUCKET:         %[[CAT:.*]] = torch.aten.cat {{.*}} -> !torch.vtensor<[2,6],f32>
// BUCKET:         %[[FLAT:.*]] = torch.aten.reshape %[[CAT]], {{.*}} -> !torch.vtensor<[12],f32>
// BUCKET:         %[[RS:.*]] = torch.operator "torch._c10d_functional.reduce_scatter_tensor"(%[[FLAT]], {{.*}} -> !torch.vtensor<[6],f32>
// BUCKET-NOT:     reduce_scatter_tensor
// BUCKET:         torch.operator "torch._c10d_functional.all_reduce"(%arg2
// BUCKET:         %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[RS]])
// BUCKET:         torch.aten.slice.Tensor %[[W]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : {{.*}} -> !torch.vtensor<[3],f32>
// BUCKET:         torch.aten.slice.Tensor %[[W]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : {{.*}} -> !torch.vtensor<[3],f32>
// With all-to-all the whole gradient joins the bucket: one copy per rank
// ([2, 2], expanded), all three summed by one all_to_all_single.
// RUN: lazy-mlir-opt %s -p "zero-reduce-grads{all-to-all=true,bucket-bytes=64}" --split-input-file | filecheck %s --check-prefix=MIXED
// MIXED-LABEL: func.func @bucketed
// MIXED:         torch.aten.expand %{{.*}} : !torch.vtensor<[1,2],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,2],f32>
// MIXED:         %[[CAT:.*]] = torch.aten.cat {{.*}} -> !torch.vtensor<[2,8],f32>
// MIXED:         %[[FLAT:.*]] = torch.aten.reshape %[[CAT]], {{.*}} -> !torch.vtensor<[16],f32>
// MIXED:         %[[SENT:.*]] = torch.operator "torch._c10d_functional.all_to_all_single"(%[[FLAT]]
// MIXED:         %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[SENT]])
// MIXED:         torch.aten.view %[[W]], %{{.*}} -> !torch.vtensor<[2,8],f32>
// MIXED:         %[[SUM:.*]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[8],f32>
// MIXED-COUNT-3: torch.aten.slice.Tensor %[[SUM]]
// MIXED-LABEL: func.func @not_bucketed
// BUCKET-LABEL: func.func @not_bucketed
// BUCKET-COUNT-2: reduce_scatter_tensor
func.func @bucketed(%g: !torch.vtensor<[6],f32>, %h: !torch.vtensor<[5],f32>, %k: !torch.vtensor<[2],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[2],f32>) {
  %rep1 = torch.constant.int 1
  %sharded = torch.constant.bool true
  %whole = torch.constant.bool false
  %norep = torch.constant.str ""
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  %m = torch.aten.mul.Tensor %h, %h : !torch.vtensor<[5],f32>, !torch.vtensor<[5],f32> -> !torch.vtensor<[5],f32>
  %s = torch.operator "torch.lazy_mlir.reduce_grad"(%m, %int2, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[5],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  %a = torch.operator "torch.lazy_mlir.reduce_grad"(%k, %int2, %str, %whole, %rep1, %norep) : (!torch.vtensor<[2],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  return %r, %s, %a : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[2],f32>
}

// -----

// The first result is used before the second marker: no bucket (its wait
// would precede the shared collective's start).
func.func @not_bucketed(%g: !torch.vtensor<[6],f32>, %h: !torch.vtensor<[6],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %rep1 = torch.constant.int 1
  %sharded = torch.constant.bool true
  %norep = torch.constant.str ""
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  %u = torch.aten.mul.Tensor %r, %r : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  %s = torch.operator "torch.lazy_mlir.reduce_grad"(%h, %int2, %str, %sharded, %rep1, %norep) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  return %u, %s : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// -----

// Hybrid sharding: 2 ranks a group, 2 replicas of it. Each gradient's shard
// is summed over the group (reduce-scatter), then over the replica group
// (all-reduce), and divided by 4. The first shard's all-reduce starts where
// the second gradient's reduce-scatter does (its own reduce-scatter waited
// for there, a stretch of compute after it started); the last one's at its
// first use. Each all-reduce is waited for at its first use.
// CHECK-LABEL: func.func @hybrid
// CHECK:         %[[RS1:.*]] = torch.operator "torch._c10d_functional.reduce_scatter_tensor"(%{{.*}}, %{{.*}}, %{{.*}}, %[[SHARDS:.*]]) : {{.*}} -> !torch.vtensor<[3],f32>
// CHECK-NEXT:    %[[X:.*]] = torch.aten.mul.Tensor %arg2, %arg2
// CHECK-NEXT:    %[[W1:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[RS1]])
// CHECK-NEXT:    %[[SUM:.*]] = torch.constant.str "sum"
// CHECK-NEXT:    %[[AR1:.*]] = torch.operator "torch._c10d_functional.all_reduce"(%[[W1]], %[[SUM]], %[[REPLICAS:.*]]) :
// CHECK:         %[[RS2:.*]] = torch.operator "torch._c10d_functional.reduce_scatter_tensor"(%{{.*}}, %{{.*}}, %{{.*}}, %[[SHARDS]])
// CHECK-NEXT:    %[[Z:.*]] = torch.aten.mul.Tensor %[[X]], %[[X]]
// CHECK-NEXT:    %[[V1:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[AR1]])
// CHECK-NEXT:    %[[FOUR:.*]] = torch.constant.int 4
// CHECK-NEXT:    %[[MEAN1:.*]] = torch.aten.div.Scalar %[[V1]], %[[FOUR]]
// CHECK-NEXT:    %[[W2:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[RS2]])
// CHECK-NEXT:    %[[SUM2:.*]] = torch.constant.str "sum"
// CHECK-NEXT:    %[[AR2:.*]] = torch.operator "torch._c10d_functional.all_reduce"(%[[W2]], %[[SUM2]], %[[REPLICAS]]) :
// CHECK-NEXT:    %[[V2:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[AR2]])
// CHECK-NEXT:    %[[FOUR2:.*]] = torch.constant.int 4
// CHECK-NEXT:    %[[MEAN2:.*]] = torch.aten.div.Scalar %[[V2]], %[[FOUR2]]
// CHECK-NEXT:    return %[[MEAN1]], %[[MEAN2]], %[[Z]]
// CHECK-NOT:     lazy_mlir.reduce_grad
func.func @hybrid(%g: !torch.vtensor<[6],f32>, %h: !torch.vtensor<[5],f32>, %s: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %int2 = torch.constant.int 2
  %shards = torch.constant.str "lazy_mlir.shard.0.2"
  %sharded = torch.constant.bool true
  %replicas = torch.constant.str "lazy_mlir.replica.0.2"
  %r = torch.operator "torch.lazy_mlir.reduce_grad"(%g, %int2, %shards, %sharded, %int2, %replicas) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  %x = torch.aten.mul.Tensor %s, %s : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  %q = torch.operator "torch.lazy_mlir.reduce_grad"(%h, %int2, %shards, %sharded, %int2, %replicas) : (!torch.vtensor<[5],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[3],f32>
  %z = torch.aten.mul.Tensor %x, %x : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  return %r, %q, %z : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}
