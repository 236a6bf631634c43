// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file | filecheck %s
// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file --mlir-print-debuginfo | filecheck %s --check-prefix=LOC
// RUN: lazy-mlir-opt %s -p fold-copy-ops --split-input-file | filecheck %s --check-prefix=GONE

// No copy, _unsafe_view, detach or alias op is left in the functional
// functions, except the one detach_copy that changes the type
// (@identity_changing_type); the functions from @source_written_later on
// write a tensor, and keep the copies a write could reach.
// GONE-NOT:  {{aten\.(\w+_copy|_unsafe_view|detach|alias)}}
// GONE:      func.func @identity_changing_type
// GONE-NEXT:   torch.aten.detach_copy %arg0 : !torch.vtensor<*,f32> -> !torch.vtensor<[4],f32>
// GONE-NOT:  {{aten\.(\w+_copy|_unsafe_view|detach|alias)}}
// GONE:      func.func @source_written_later

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

// -----

// The precondition: no buffer a folded view would share may be written.
// typed in-place ops (torch.aten.copy_, add_...) take !torch.tensor only; on
// value tensors they come as torch.operator (FxImporter's form for a graph
// that is not functional). Here t_copy's source is written after it: as t,
// %0 would see the new contents. The write through the view %w of %x
// counts too; the unrelated %y's copy is still folded.

// CHECK-LABEL: func.func @source_written_later
// CHECK:         %[[X:.*]] = torch.aten.mul.Tensor %arg0, %arg0
// CHECK-NEXT:    %[[Y:.*]] = torch.aten.add.Tensor %arg0, %arg0
// CHECK-NEXT:    %[[KEPT:.*]] = torch.aten.t_copy %[[X]]
// CHECK-NEXT:    %[[VIEW:.*]] = torch.aten.select.int %[[X]]
// CHECK-NEXT:    torch.operator "torch.aten.copy_"(%[[VIEW]], %arg1, %false)
// CHECK-NEXT:    %[[FOLDED:.*]] = torch.aten.t %[[Y]]
// CHECK-NEXT:    return %[[KEPT]], %[[FOLDED]]
func.func @source_written_later(%arg0: !torch.vtensor<[4,3],f32>, %arg1: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>) {
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %x = torch.aten.mul.Tensor %arg0, %arg0 : !torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %y = torch.aten.add.Tensor %arg0, %arg0, %int0 : !torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>, !torch.int -> !torch.vtensor<[4,3],f32>
  %0 = torch.aten.t_copy %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %w = torch.aten.select.int %x, %int0, %int0 : !torch.vtensor<[4,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3],f32>
  %1 = torch.operator "torch.aten.copy_"(%w, %arg1, %false) : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.bool) -> !torch.vtensor<[3],f32>
  %2 = torch.aten.t_copy %y : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %0, %2 : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>
}

// -----

// A write to the copy's result (in place, through a chain of copies that
// would all become views) would reach the source: every copy of the chain
// is kept; a copy of an unrelated value in the same function is folded
// (%z is computed here: the inputs count as one buffer, see @inputs_may_alias).

// CHECK-LABEL: func.func @result_written
// CHECK:         %[[X:.*]] = torch.aten.neg %arg0
// CHECK-NEXT:    %[[Z:.*]] = torch.aten.neg %arg2
// CHECK-NEXT:    %[[A:.*]] = torch.aten.slice_copy.Tensor %[[X]], %int0
// CHECK-NEXT:    %[[B:.*]] = torch.aten.transpose_copy.int %[[A]]
// CHECK-NEXT:    torch.operator "torch.aten.add_.Tensor"(%[[B]], %arg1, %int1)
// CHECK-NEXT:    %[[T:.*]] = torch.aten.t %[[Z]]
// CHECK-NEXT:    return %[[X]], %{{.*}}, %[[T]]
func.func @result_written(%arg0: !torch.vtensor<[4,3],f32>, %arg1: !torch.vtensor<[3,2],f32>, %arg2: !torch.vtensor<[4,3],f32>) -> (!torch.vtensor<[4,3],f32>, !torch.vtensor<[3,2],f32>, !torch.vtensor<[3,4],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %x = torch.aten.neg %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %z = torch.aten.neg %arg2 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %0 = torch.aten.slice_copy.Tensor %x, %int0, %int0, %int2, %int1 : !torch.vtensor<[4,3],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,3],f32>
  %1 = torch.aten.transpose_copy.int %0, %int0, %int1 : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,2],f32>
  %2 = torch.operator "torch.aten.add_.Tensor"(%1, %arg1, %int1) : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32>, !torch.int) -> !torch.vtensor<[3,2],f32>
  %3 = torch.aten.t_copy %z : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %x, %2, %3 : !torch.vtensor<[4,3],f32>, !torch.vtensor<[3,2],f32>, !torch.vtensor<[3,4],f32>
}

// -----

// out= overloads write their out operands: typed (arange.start_out) or
// generic (add.out). Dropping the alias_copy would make arange write %arg0.

// CHECK-LABEL: func.func @out_written
// CHECK:         %[[A:.*]] = torch.aten.alias_copy %arg0
// CHECK-NEXT:    torch.aten.arange.start_out %int0, %int4, %int1, %[[A]]
// CHECK:         %[[V:.*]] = torch.aten.view_copy %arg1
// CHECK-NEXT:    torch.operator "torch.aten.add.out"(%arg2, %arg2, %int1, %[[V]])
func.func @out_written(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[2,2],f32>, %arg2: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int4 = torch.constant.int 4
  %0 = torch.aten.alias_copy %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.arange.start_out %int0, %int4, %int1, %0 : !torch.int, !torch.int, !torch.int, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %size = torch.prim.ListConstruct %int4 : (!torch.int) -> !torch.list<int>
  %2 = torch.aten.view_copy %arg1, %size : !torch.vtensor<[2,2],f32>, !torch.list<int> -> !torch.vtensor<[4],f32>
  %3 = torch.operator "torch.aten.add.out"(%arg2, %arg2, %int1, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %1, %3 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// The function's inputs may share a buffer (LTC passes one tensor at two
// positions): a write to %arg1 keeps the copy of %arg0.

// CHECK-LABEL: func.func @inputs_may_alias
// CHECK:         torch.aten.t_copy %arg0
func.func @inputs_may_alias(%arg0: !torch.vtensor<[4,3],f32>, %arg1: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %float1 = torch.constant.float 1.0
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %1 = torch.operator "torch.aten.fill_.Scalar"(%arg1, %float1) : (!torch.vtensor<[4,3],f32>, !torch.float) -> !torch.vtensor<[4,3],f32>
  return %0 : !torch.vtensor<[3,4],f32>
}

// -----

// Writes through a list (_foreach ops) and through reference semantics:
// torch.copy.to_tensor + a typed in-place op, torch.overwrite.tensor.contents,
// a !torch.tensor read back by torch.copy.to_vtensor.

// CHECK-LABEL: func.func @written_through_list
// CHECK:         torch.aten.t_copy
func.func @written_through_list(%arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %float1 = torch.constant.float 1.0
  %x = torch.aten.neg %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %0 = torch.aten.t_copy %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %list = torch.prim.ListConstruct %0 : (!torch.vtensor<[3,4],f32>) -> !torch.list<vtensor>
  torch.operator "torch.aten._foreach_add_.Scalar"(%list, %float1) : (!torch.list<vtensor>, !torch.float) -> ()
  return %0 : !torch.vtensor<[3,4],f32>
}

// CHECK-LABEL: func.func @written_as_reference
// CHECK:         %[[KEPT:.*]] = torch.aten.t_copy %[[X:.*]] :
// CHECK-NEXT:    %[[T:.*]] = torch.copy.to_tensor %[[KEPT]]
// CHECK-NEXT:    torch.aten.copy_ %[[T]], %arg1, %false : !torch.tensor<[3,4],f32>, !torch.tensor<[3,4],f32>, !torch.bool -> !torch.tensor<[3,4],f32>
func.func @written_as_reference(%arg0: !torch.vtensor<[4,3],f32>, %arg1: !torch.tensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32> {
  %false = torch.constant.bool false
  %x = torch.aten.neg %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %0 = torch.aten.t_copy %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %1 = torch.copy.to_tensor %0 : !torch.tensor<[3,4],f32>
  %2 = torch.aten.copy_ %1, %arg1, %false : !torch.tensor<[3,4],f32>, !torch.tensor<[3,4],f32>, !torch.bool -> !torch.tensor<[3,4],f32>
  return %0 : !torch.vtensor<[3,4],f32>
}

// CHECK-LABEL: func.func @overwritten
// CHECK:         torch.aten.t_copy
func.func @overwritten(%arg0: !torch.vtensor<[4,3],f32>, %arg1: !torch.tensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32> {
  %x = torch.aten.neg %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %0 = torch.aten.t_copy %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  torch.overwrite.tensor.contents %0 overwrites %arg1 : !torch.vtensor<[3,4],f32>, !torch.tensor<[3,4],f32>
  return %0 : !torch.vtensor<[3,4],f32>
}

// CHECK-LABEL: func.func @read_from_reference
// CHECK:         torch.aten.t_copy
func.func @read_from_reference(%arg0: !torch.tensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %0 = torch.copy.to_vtensor %arg0 : !torch.vtensor<[4,3],f32>
  %1 = torch.aten.t_copy %0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  return %1 : !torch.vtensor<[3,4],f32>
}

// -----

// native_batch_norm's schema declares no write, but in training it updates
// the running statistics in place: their copies are kept; not in eval.

// CHECK-LABEL: func.func @batch_norm_training
// CHECK:         torch.aten.select_copy.int %arg2
// CHECK:         torch.aten.select_copy.int %arg2
func.func @batch_norm_training(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3],f32>, %stats: !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %true = torch.constant.bool true
  %momentum = torch.constant.float 1.000000e-01
  %eps = torch.constant.float 1.000000e-05
  %mean = torch.aten.select_copy.int %stats, %int0, %int0 : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3],f32>
  %var = torch.aten.select_copy.int %stats, %int0, %int1 : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3],f32>
  %0:3 = torch.aten.native_batch_norm %x, %w, %w, %mean, %var, %true, %momentum, %eps : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.bool, !torch.float, !torch.float -> !torch.vtensor<[2,3],f32>, !torch.vtensor<[0],f32>, !torch.vtensor<[0],f32>
  return %0#0, %mean : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>
}

// CHECK-LABEL: func.func @batch_norm_eval
// CHECK:         torch.aten.select.int %arg2
// CHECK:         torch.aten.select.int %arg2
func.func @batch_norm_eval(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3],f32>, %stats: !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %momentum = torch.constant.float 1.000000e-01
  %eps = torch.constant.float 1.000000e-05
  %mean = torch.aten.select_copy.int %stats, %int0, %int0 : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3],f32>
  %var = torch.aten.select_copy.int %stats, %int0, %int1 : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3],f32>
  %0:3 = torch.aten.native_batch_norm %x, %w, %w, %mean, %var, %false, %momentum, %eps : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.bool, !torch.float, !torch.float -> !torch.vtensor<[2,3],f32>, !torch.vtensor<[0],f32>, !torch.vtensor<[0],f32>
  return %0#0, %mean : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3],f32>
}

// -----

// A callee may write its arguments (it is not looked into).

// CHECK-LABEL: func.func @passed_to_call
// CHECK:         torch.aten.t_copy
func.func private @callee(!torch.vtensor<[3,4],f32>)
func.func @passed_to_call(%arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %0 = torch.aten.t_copy %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  func.call @callee(%0) : (!torch.vtensor<[3,4],f32>) -> ()
  return %0 : !torch.vtensor<[3,4],f32>
}

// -----

// Values that go through control flow join their classes: the copy yielded
// by prim.If is written through the If's result.

// CHECK-LABEL: func.func @written_after_if
// CHECK:         torch.aten.t_copy
func.func @written_after_if(%c: !torch.bool, %arg0: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3,4],f32> {
  %float1 = torch.constant.float 1.0
  %x = torch.aten.neg %arg0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %y = torch.aten.neg %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  %0 = torch.prim.If %c -> (!torch.vtensor<[4,3],f32>) {
    torch.prim.If.yield %x : !torch.vtensor<[4,3],f32>
  } else {
    torch.prim.If.yield %y : !torch.vtensor<[4,3],f32>
  }
  %1 = torch.aten.t_copy %x : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %2 = torch.operator "torch.aten.fill_.Scalar"(%0, %float1) : (!torch.vtensor<[4,3],f32>, !torch.float) -> !torch.vtensor<[4,3],f32>
  return %1 : !torch.vtensor<[3,4],f32>
}
