// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file | filecheck %s
// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file --mlir-print-debuginfo | filecheck %s --check-prefix=LOC
// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file | filecheck %s --check-prefix=GONE

// No copy, _unsafe_view, detach or alias op is left anywhere, except the one
// detach_copy that changes the type (@identity_changing_type).
// GONE-NOT:  {{aten\.(\w+_copy|_unsafe_view|detach|alias)}}
// GONE:      func.func @identity_changing_type
// GONE-NEXT:   torch.aten.detach_copy %arg0 : !torch.vtensor<*,f32> -> !torch.vtensor<[4],f32>
// GONE-NOT:  {{aten\.(\w+_copy|_unsafe_view|detach|alias)}}

// Each copy variant becomes its view op with the same operands and types.

// CHECK-LABEL: func.func @t_copy
// CHECK-NEXT:    %[[T:.*]] = torch.aten.t %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
// CHECK-NEXT:    return %[[T]]
func.func @t_copy(%arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %0 : !torch.vtensor<[3,4],f32>
}

// -----

// CHECK-LABEL: func.func @view_copy_and_unsafe_view
// CHECK:         %[[SIZE:.*]] = torch.prim.ListConstruct
// CHECK-NEXT:    %[[A:.*]] = torch.aten.reshape %arg0, %[[SIZE]] : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
// CHECK-NEXT:    %[[B:.*]] = torch.aten.reshape %arg0, %[[SIZE]] : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
// CHECK-NEXT:    return %[[A]], %[[B]]
func.func @view_copy_and_unsafe_view(%arg0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[16],f32>, !torch.vtensor<[16],f32>) {
  %int16 = torch.constant.int 16
  %0 = torch.prim.ListConstruct %int16 : (!torch.int) -> !torch.list<int>
  %1 = torch.aten.view_copy %arg0, %0 : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
  %2 = torch.aten._unsafe_view %arg0, %0 : !torch.vtensor<[4,4],f32>, !torch.list<int> -> !torch.vtensor<[16],f32>
  return %1, %2 : !torch.vtensor<[16],f32>, !torch.vtensor<[16],f32>
}

// -----

// CHECK-LABEL: func.func @view_copy_dtype
// CHECK:         torch.aten.view.dtype %arg0, %{{.*}} : !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],si32>
func.func @view_copy_dtype(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],si32> {
  %int3 = torch.constant.int 3
  %0 = torch.aten.view_copy.dtype %arg0, %int3 : !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],si32>
  return %0 : !torch.vtensor<[4],si32>
}

// -----

// CHECK-LABEL: func.func @permute_transpose_expand
// CHECK:         %[[P:.*]] = torch.aten.permute %arg0, %{{.*}} : !torch.vtensor<[2,3],f32>, !torch.list<int> -> !torch.vtensor<[3,2],f32>
// CHECK:         %[[T:.*]] = torch.aten.transpose.int %[[P]], %int0, %int1 : !torch.vtensor<[3,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,3],f32>
// CHECK:         %[[E:.*]] = torch.aten.expand %[[T]], %{{.*}}, %false : !torch.vtensor<[2,3],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[5,2,3],f32>
// CHECK-NEXT:    return %[[E]]
func.func @permute_transpose_expand(%arg0: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[5,2,3],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int5 = torch.constant.int 5
  %false = torch.constant.bool false
  %dims = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %0 = torch.aten.permute_copy %arg0, %dims : !torch.vtensor<[2,3],f32>, !torch.list<int> -> !torch.vtensor<[3,2],f32>
  %1 = torch.aten.transpose_copy.int %0, %int0, %int1 : !torch.vtensor<[3,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,3],f32>
  %size = torch.prim.ListConstruct %int5, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %2 = torch.aten.expand_copy %1, %size, %false : !torch.vtensor<[2,3],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[5,2,3],f32>
  return %2 : !torch.vtensor<[5,2,3],f32>
}

// -----

// CHECK-LABEL: func.func @select_slice_diagonal
// CHECK:         torch.aten.select.int %arg0, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4],f32>
// CHECK:         torch.aten.slice.Tensor %arg0, %int0, %int1, %int3, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4],f32>
// CHECK:         torch.aten.diagonal %arg0, %int0, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4],f32>
func.func @select_slice_diagonal(%arg0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int3 = torch.constant.int 3
  %0 = torch.aten.select_copy.int %arg0, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4],f32>
  %1 = torch.aten.slice_copy.Tensor %arg0, %int0, %int1, %int3, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4],f32>
  %2 = torch.aten.diagonal_copy %arg0, %int0, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[4],f32>
  return %0, %1, %2 : !torch.vtensor<[4],f32>, !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32>
}

// -----

// squeeze_copy.dims has no torch-mlir op: it comes and goes as torch.operator.

// CHECK-LABEL: func.func @unsqueeze_squeeze
// CHECK:         %[[U:.*]] = torch.aten.unsqueeze %arg0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,1,4],f32>
// CHECK-NEXT:    torch.aten.squeeze %[[U]] : !torch.vtensor<[4,1,4],f32> -> !torch.vtensor<[4,4],f32>
// CHECK-NEXT:    torch.aten.squeeze.dim %[[U]], %int1 : !torch.vtensor<[4,1,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
// CHECK:         torch.operator "torch.aten.squeeze.dims"(%[[U]], %{{.*}}) : (!torch.vtensor<[4,1,4],f32>, !torch.list<int>) -> !torch.vtensor<[4,4],f32>
func.func @unsqueeze_squeeze(%arg0: !torch.vtensor<[4,4],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) {
  %int1 = torch.constant.int 1
  %0 = torch.aten.unsqueeze_copy %arg0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,1,4],f32>
  %1 = torch.aten.squeeze_copy %0 : !torch.vtensor<[4,1,4],f32> -> !torch.vtensor<[4,4],f32>
  %2 = torch.aten.squeeze_copy.dim %0, %int1 : !torch.vtensor<[4,1,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
  %dims = torch.prim.ListConstruct %int1 : (!torch.int) -> !torch.list<int>
  %3 = torch.operator "torch.aten.squeeze_copy.dims"(%0, %dims) : (!torch.vtensor<[4,1,4],f32>, !torch.list<int>) -> !torch.vtensor<[4,4],f32>
  return %1, %2, %3 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>
}

// -----

// CHECK-LABEL: func.func @splits
// CHECK:         torch.aten.split.Tensor %arg0, %int2, %int0 : !torch.vtensor<[4,3],f32>, !torch.int, !torch.int -> !torch.list<vtensor<[2,3],f32>>
// CHECK:         torch.aten.split_with_sizes %arg0, %{{.*}}, %int0 : !torch.vtensor<[4,3],f32>, !torch.list<int>, !torch.int -> !torch.list<vtensor<[2,3],f32>>
// CHECK:         torch.aten.unbind.int %arg0, %int0 : !torch.vtensor<[4,3],f32>, !torch.int -> !torch.list<vtensor<[3],f32>>
func.func @splits(%arg0: !torch.vtensor<[4,3],f32>) -> (!torch.list<vtensor<[2,3],f32>>, !torch.list<vtensor<[2,3],f32>>, !torch.list<vtensor<[3],f32>>) {
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %0 = torch.aten.split_copy.Tensor %arg0, %int2, %int0 : !torch.vtensor<[4,3],f32>, !torch.int, !torch.int -> !torch.list<vtensor<[2,3],f32>>
  %sizes = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %1 = torch.aten.split_with_sizes_copy %arg0, %sizes, %int0 : !torch.vtensor<[4,3],f32>, !torch.list<int>, !torch.int -> !torch.list<vtensor<[2,3],f32>>
  %2 = torch.aten.unbind_copy.int %arg0, %int0 : !torch.vtensor<[4,3],f32>, !torch.int -> !torch.list<vtensor<[3],f32>>
  return %0, %1, %2 : !torch.list<vtensor<[2,3],f32>>, !torch.list<vtensor<[2,3],f32>>, !torch.list<vtensor<[3],f32>>
}

// -----

// detach/alias (copy or not) disappear: their users take the operand.

// CHECK-LABEL: func.func @identities
// CHECK:         %[[SUM:.*]] = torch.aten.add.Tensor %arg0, %arg0, %int1
// CHECK-NEXT:    return %arg0, %[[SUM]], %arg0
func.func @identities(%arg0: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %0 = torch.aten.detach_copy %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.alias_copy %0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.detach %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %3 = torch.aten.alias %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %int1 = torch.constant.int 1
  %4 = torch.aten.add.Tensor %1, %2, %int1 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  return %0, %4, %3 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// A detach that refines the type cannot be dropped without changing a type.

// CHECK-LABEL: func.func @identity_changing_type
// CHECK-NEXT:    torch.aten.detach_copy %arg0 : !torch.vtensor<*,f32> -> !torch.vtensor<[4],f32>
func.func @identity_changing_type(%arg0: !torch.vtensor<*,f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.detach_copy %arg0 : !torch.vtensor<*,f32> -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

// Locations are kept.

// LOC-LABEL: func.func @keeps_location
// LOC:         torch.aten.t %arg0 {{.*}} loc(#[[LOC:loc[0-9]*]])
// LOC:         #[[LOC]] = loc("model.py":12:3)
func.func @keeps_location(%arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32> loc("model.py":12:3)
  return %0 : !torch.vtensor<[3,4],f32>
}
