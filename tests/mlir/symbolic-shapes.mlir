// RUN: lazy-mlir-opt %s -p fold-copy-ops,scalar-implicit-to-tensor,specialize-scalars,cse --split-input-file | filecheck %s

// A shape-generic group (lazy_mlir/shape_generic.py): `?` dims, sizes read
// with torch.aten.size.int and combined with int arithmetic. The default
// pipeline keeps the size computation as it is and folds the copies into
// views on the `?` types.

// CHECK-LABEL: func.func @view_of_symbolic_size
// CHECK:         %[[S:.*]] = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?,16],f32>, !torch.int -> !torch.int
// CHECK:         %[[BT:.*]] = torch.aten.mul.int %int2, %[[S]] : !torch.int, !torch.int -> !torch.int
// CHECK:         %[[SIZES:.*]] = torch.prim.ListConstruct %[[BT]], %int16
// CHECK-NEXT:    %[[V:.*]] = torch.aten.reshape %arg0, %[[SIZES]] : !torch.vtensor<[2,?,16],f32>, !torch.list<int> -> !torch.vtensor<[?,16],f32>
// CHECK-NEXT:    %[[T:.*]] = torch.aten.t %arg1 : !torch.vtensor<[16,8],f32> -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT:    %[[MM:.*]] = torch.aten.mm %[[V]], %arg1
// CHECK:         return %[[MM]], %[[T]]
func.func @view_of_symbolic_size(%arg0: !torch.vtensor<[2,?,16],f32>, %arg1: !torch.vtensor<[16,8],f32>) -> (!torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32>) {
  %int1 = torch.constant.int 1
  %0 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?,16],f32>, !torch.int -> !torch.int
  %int2 = torch.constant.int 2
  %1 = torch.aten.mul.int %int2, %0 : !torch.int, !torch.int -> !torch.int
  %int16 = torch.constant.int 16
  %2 = torch.prim.ListConstruct %1, %int16 : (!torch.int, !torch.int) -> !torch.list<int>
  %3 = torch.aten.view_copy %arg0, %2 : !torch.vtensor<[2,?,16],f32>, !torch.list<int> -> !torch.vtensor<[?,16],f32>
  %4 = torch.aten.t_copy %arg1 : !torch.vtensor<[16,8],f32> -> !torch.vtensor<[8,16],f32>
  %5 = torch.aten.mm %3, %arg1 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,8],f32> -> !torch.vtensor<[?,8],f32>
  return %5, %4 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32>
}
