// RUN: not lazy-mlir-opt %s -p zero-reduce-grads --split-input-file 2>&1 | filecheck %s

// The group size must be a constant: the collective's shard size depends on it.

// CHECK: error: zero-reduce-grads: 'torch.operator' at "-":[[# @LINE + 6]]:8: group size (an int) and sharded (a bool) must be constants
func.func @runtime_group_size(%arg0: !torch.vtensor<[6],f32>, %world: !torch.int) -> !torch.vtensor<[2],f32> {
  %rep1 = torch.constant.int 1
  %sharded = torch.constant.bool true
  %norep = torch.constant.str ""
  %name = torch.constant.str "0"
  %0 = torch.operator "torch.lazy_mlir.reduce_grad"(%arg0, %world, %name, %sharded, %rep1, %norep) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.bool, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}
