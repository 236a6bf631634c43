// RUN: not lazy-mlir-opt %s -p zero-reduce-grads --split-input-file 2>&1 | filecheck %s

// The group size must be a constant: the collective's shard size depends on it.

// CHECK: error: zero-reduce-grads: 'torch.operator' at "-":[[# @LINE + 6]]:8: group size and rank must be constants
func.func @runtime_group_size(%arg0: !torch.vtensor<[6],f32>, %world: !torch.int) -> !torch.vtensor<[2],f32> {
  %rep1 = torch.constant.int 1
  %norep = torch.constant.str ""
  %name = torch.constant.str "0"
  %rank = torch.constant.int 1
  %0 = torch.operator "torch.lazy_mlir.reduce_grad"(%arg0, %world, %name, %rank, %rep1, %norep) : (!torch.vtensor<[6],f32>, !torch.int, !torch.str, !torch.int, !torch.int, !torch.str) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}
