// RUN: lazy-mlir-opt %s -p scalar-implicit-to-tensor --split-input-file | filecheck %s

// Each function is checked line by line (CHECK-NEXT from label to return),
// so removed ops (ScalarImplicit, the .Scalar overloads) cannot remain.

// The runtime alpha of add/sub.Tensor becomes a mul by the 0-d tensor.

// CHECK-LABEL: func.func @alpha
// CHECK-NEXT:    %[[SCALED:.*]] = torch.aten.mul.Tensor %arg1, %arg2 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4,4],f32>
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[ADD:.*]] = torch.aten.add.Tensor %arg0, %[[SCALED]], %[[ONE]] : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
// CHECK-NEXT:    %[[SCALED2:.*]] = torch.aten.mul.Tensor %arg1, %arg2
// CHECK-NEXT:    %[[ONE2:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[SUB:.*]] = torch.aten.sub.Tensor %arg0, %[[SCALED2]], %[[ONE2]] : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
// CHECK-NEXT:    return %[[ADD]], %[[SUB]]
func.func @alpha(%arg0: !torch.vtensor<[4,4],f32>, %arg1: !torch.vtensor<[4,4],f32>, %arg2: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.add.Tensor %arg0, %arg1, %0 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.float -> !torch.vtensor<[4,4],f32>
  %2 = torch.aten.sub.Tensor %arg0, %arg1, %0 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.float -> !torch.vtensor<[4,4],f32>
  return %1, %2 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>
}

// -----

// X.Scalar -> X.Tensor with the same operands (alpha stays a scalar).

// CHECK-LABEL: func.func @scalar_overloads
// CHECK-NEXT:    %int1 = torch.constant.int 1
// CHECK-NEXT:    %str = torch.constant.str "floor"
// CHECK-NEXT:    torch.aten.add.Tensor %arg0, %arg1, %int1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.int -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.sub.Tensor %arg0, %arg1, %int1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.int -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.mul.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.div.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.div.Tensor_mode %arg0, %arg1, %str : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.str -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.lt.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],i1>
// CHECK-NEXT:    torch.aten.pow.Tensor_Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @scalar_overloads(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],i1>, !torch.vtensor<[4],f32>) {
  %int1 = torch.constant.int 1
  %str = torch.constant.str "floor"
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.add.Scalar %arg0, %0, %int1 : !torch.vtensor<[4],f32>, !torch.float, !torch.int -> !torch.vtensor<[4],f32>
  %2 = torch.aten.sub.Scalar %arg0, %0, %int1 : !torch.vtensor<[4],f32>, !torch.float, !torch.int -> !torch.vtensor<[4],f32>
  %3 = torch.aten.mul.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %4 = torch.aten.div.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %5 = torch.aten.div.Scalar_mode %arg0, %0, %str : !torch.vtensor<[4],f32>, !torch.float, !torch.str -> !torch.vtensor<[4],f32>
  %6 = torch.aten.lt.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],i1>
  %7 = torch.aten.pow.Tensor_Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %1, %2, %3, %4, %5, %6, %7 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],i1>, !torch.vtensor<[4],f32>
}

// -----

// A runtime other and a runtime alpha: add.Scalar -> add.Tensor -> mul.

// CHECK-LABEL: func.func @scalar_with_runtime_alpha
// CHECK-NEXT:    %[[PRODUCT:.*]] = torch.aten.mul.Tensor %arg1, %arg2 : !torch.vtensor<[],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[],f32>
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    torch.aten.add.Tensor %arg0, %[[PRODUCT]], %[[ONE]] : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.int -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @scalar_with_runtime_alpha(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f32>, %arg2: !torch.vtensor<[],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %2 = torch.aten.add.Scalar %arg0, %0, %1 : !torch.vtensor<[4],f32>, !torch.float, !torch.float -> !torch.vtensor<[4],f32>
  return %2 : !torch.vtensor<[4],f32>
}

// -----

// CHECK-LABEL: func.func @fills
// CHECK-NEXT:    torch.aten.masked_fill.Tensor %arg0, %arg1, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],i1>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.fill.Tensor %arg0, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.where.self %arg1, %arg0, %arg2 : !torch.vtensor<[4],i1>, !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.where.self %arg1, %arg2, %arg0 : !torch.vtensor<[4],i1>, !torch.vtensor<[],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @fills(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],i1>, %arg2: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.masked_fill.Scalar %arg0, %arg1, %0 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],i1>, !torch.float -> !torch.vtensor<[4],f32>
  %2 = torch.aten.fill.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %3 = torch.aten.where.ScalarOther %arg1, %arg0, %0 : !torch.vtensor<[4],i1>, !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %4 = torch.aten.where.ScalarSelf %arg1, %0, %arg0 : !torch.vtensor<[4],i1>, !torch.float, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %1, %2, %3, %4 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// clamp: each bound a runtime scalar or None; a constant bound keeps clamp.

// CHECK-LABEL: func.func @clamps
// CHECK-NEXT:    %none = torch.constant.none
// CHECK-NEXT:    %[[TWO:.*]] = torch.constant.float 2.000000e+00
// CHECK-NEXT:    %[[MIN:.*]] = torch.aten.ScalarImplicit %arg1
// CHECK-NEXT:    torch.aten.clamp.Tensor %arg0, %arg1, %none : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.none -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.clamp.Tensor %arg0, %arg1, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.clamp %arg0, %[[MIN]], %[[TWO]]
// CHECK-NEXT:    torch.aten.clamp_min.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    torch.aten.clamp_max.Tensor %arg0, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @clamps(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f32>, %arg2: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %none = torch.constant.none
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %2 = torch.aten.clamp %arg0, %0, %none : !torch.vtensor<[4],f32>, !torch.float, !torch.none -> !torch.vtensor<[4],f32>
  %3 = torch.aten.clamp %arg0, %0, %1 : !torch.vtensor<[4],f32>, !torch.float, !torch.float -> !torch.vtensor<[4],f32>
  %4 = torch.aten.clamp %arg0, %0, %float2 : !torch.vtensor<[4],f32>, !torch.float, !torch.float -> !torch.vtensor<[4],f32>
  %5 = torch.aten.clamp_min %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %6 = torch.aten.clamp_max %arg0, %1 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %2, %3, %4, %5, %6 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// rsub(x, s, alpha) = s - alpha * x

// CHECK-LABEL: func.func @rsub
// CHECK-NEXT:    %int1 = torch.constant.int 1
// CHECK-NEXT:    %[[R:.*]] = torch.aten.sub.Tensor %arg1, %arg0, %int1 : !torch.vtensor<[],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return %[[R]]
func.func @rsub(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.rsub.Scalar %arg0, %0, %int1 : !torch.vtensor<[4],f32>, !torch.float, !torch.int -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}

// -----

// lerp.Tensor needs the weight in the dtype of self: an f64 weight stays a scalar.

// CHECK-LABEL: func.func @lerp
// CHECK-NEXT:    torch.aten.lerp.Tensor %arg0, %arg1, %arg2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    %[[F64:.*]] = torch.aten.ScalarImplicit %arg3 : !torch.vtensor<[],f64> -> !torch.float
// CHECK-NEXT:    torch.aten.lerp.Scalar %arg0, %arg1, %[[F64]]
// CHECK-NEXT:    return
func.func @lerp(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],f32>, %arg2: !torch.vtensor<[],f32>, %arg3: !torch.vtensor<[],f64>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.lerp.Scalar %arg0, %arg1, %0 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %2 = torch.aten.ScalarImplicit %arg3 : !torch.vtensor<[],f64> -> !torch.float
  %3 = torch.aten.lerp.Scalar %arg0, %arg1, %2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %1, %3 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// addcmul/addcdiv(x, t1, t2, v) = x + (v * t1) *|/ t2, in eager's order; the
// middle result has the broadcast shape of t1 and t2.

// CHECK-LABEL: func.func @addc
// CHECK-NEXT:    %[[V1:.*]] = torch.aten.mul.Tensor %arg1, %arg3 : !torch.vtensor<[3,1],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[3,1],f32>
// CHECK-NEXT:    %[[P:.*]] = torch.aten.mul.Tensor %[[V1]], %arg2 : !torch.vtensor<[3,1],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[3,4],f32>
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[MUL:.*]] = torch.aten.add.Tensor %arg0, %[[P]], %[[ONE]] : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>, !torch.int -> !torch.vtensor<[3,4],f32>
// CHECK-NEXT:    %[[V1B:.*]] = torch.aten.mul.Tensor %arg1, %arg3 : !torch.vtensor<[3,1],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[3,1],f32>
// CHECK-NEXT:    %[[Q:.*]] = torch.aten.div.Tensor %[[V1B]], %arg2 : !torch.vtensor<[3,1],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[3,4],f32>
// CHECK-NEXT:    %[[ONE2:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[DIV:.*]] = torch.aten.add.Tensor %arg0, %[[Q]], %[[ONE2]] : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>, !torch.int -> !torch.vtensor<[3,4],f32>
// CHECK-NEXT:    return %[[MUL]], %[[DIV]]
func.func @addc(%arg0: !torch.vtensor<[3,4],f32>, %arg1: !torch.vtensor<[3,1],f32>, %arg2: !torch.vtensor<[4],f32>, %arg3: !torch.vtensor<[],f32>) -> (!torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg3 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.addcmul %arg0, %arg1, %arg2, %0 : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,1],f32>, !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[3,4],f32>
  %2 = torch.aten.addcdiv %arg0, %arg1, %arg2, %0 : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,1],f32>, !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[3,4],f32>
  return %1, %2 : !torch.vtensor<[3,4],f32>, !torch.vtensor<[3,4],f32>
}

// -----

// addmm(b, m1, m2, beta, alpha) = beta * b + alpha * (m1 @ m2); no mul for a
// constant 1; any other constant leaves addmm alone.

// CHECK-LABEL: func.func @addmm
// CHECK-NEXT:    %int1 = torch.constant.int 1
// CHECK-NEXT:    %[[TWO:.*]] = torch.constant.float 2.000000e+00
// CHECK-NEXT:    %[[ALPHA:.*]] = torch.aten.ScalarImplicit %arg4
// CHECK-NEXT:    %[[MM:.*]] = torch.aten.mm %arg1, %arg2 : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT:    %[[SCALED:.*]] = torch.aten.mul.Tensor %[[MM]], %arg4 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[R1:.*]] = torch.aten.add.Tensor %arg0, %[[SCALED]], %[[ONE]] : !torch.vtensor<[4],f32>, !torch.vtensor<[2,4],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT:    %[[MM2:.*]] = torch.aten.mm %arg1, %arg2
// CHECK-NEXT:    %[[SCALED2:.*]] = torch.aten.mul.Tensor %[[MM2]], %arg4
// CHECK-NEXT:    %[[BIAS:.*]] = torch.aten.mul.Tensor %arg0, %arg3 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    %[[ONE2:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[R2:.*]] = torch.aten.add.Tensor %[[BIAS]], %[[SCALED2]], %[[ONE2]] : !torch.vtensor<[4],f32>, !torch.vtensor<[2,4],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
// CHECK-NEXT:    %[[R3:.*]] = torch.aten.addmm %arg0, %arg1, %arg2, %[[TWO]], %[[ALPHA]]
// CHECK-NEXT:    return %[[R1]], %[[R2]], %[[R3]]
func.func @addmm(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[2,3],f32>, %arg2: !torch.vtensor<[3,4],f32>, %arg3: !torch.vtensor<[],f32>, %arg4: !torch.vtensor<[],f32>) -> (!torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>) {
  %int1 = torch.constant.int 1
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.ScalarImplicit %arg3 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.ScalarImplicit %arg4 : !torch.vtensor<[],f32> -> !torch.float
  %2 = torch.aten.addmm %arg0, %arg1, %arg2, %int1, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32>, !torch.int, !torch.float -> !torch.vtensor<[2,4],f32>
  %3 = torch.aten.addmm %arg0, %arg1, %arg2, %0, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32>, !torch.float, !torch.float -> !torch.vtensor<[2,4],f32>
  %4 = torch.aten.addmm %arg0, %arg1, %arg2, %float2, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32>, !torch.float, !torch.float -> !torch.vtensor<[2,4],f32>
  return %2, %3, %4 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>
}

// -----

// Where a 0-d tensor would change the result dtype (a float 0-d beside an int
// tensor, or two 0-d tensors of different dtypes) the op is left alone, and so
// is its ScalarImplicit.

// CHECK-LABEL: func.func @dtype_would_change
// CHECK-NEXT:    %[[F:.*]] = torch.aten.ScalarImplicit %arg2
// CHECK-NEXT:    torch.aten.mul.Scalar %arg1, %[[F]]
// CHECK-NEXT:    %[[D:.*]] = torch.aten.ScalarImplicit %arg4
// CHECK-NEXT:    torch.aten.mul.Scalar %arg2, %[[D]]
// CHECK-NEXT:    return
func.func @dtype_would_change(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],si64>, %arg2: !torch.vtensor<[],f32>, %arg3: !torch.vtensor<[],si64>, %arg4: !torch.vtensor<[],f64>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[],f32>) {
  %2 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],f32> -> !torch.float
  %3 = torch.aten.mul.Scalar %arg1, %2 : !torch.vtensor<[4],si64>, !torch.float -> !torch.vtensor<[4],f32>
  %4 = torch.aten.ScalarImplicit %arg4 : !torch.vtensor<[],f64> -> !torch.float
  %5 = torch.aten.mul.Scalar %arg2, %4 : !torch.vtensor<[],f32>, !torch.float -> !torch.vtensor<[],f32>
  return %3, %5 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>
}

// -----

// An int 0-d tensor beside a float dimensioned tensor (LTC passes alpha=1 that
// way) keeps the float dtype: rewritten.

// CHECK-LABEL: func.func @int_scalar_beside_float
// CHECK-NEXT:    %[[M:.*]] = torch.aten.mul.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],si64> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return %[[M]]
func.func @int_scalar_beside_float(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],si64>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],si64> -> !torch.int
  %1 = torch.aten.mul.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}

// -----

// Beside a dimensioned tensor of the same category, the 0-d dtype does not matter.

// CHECK-LABEL: func.func @f64_scalar_beside_f32
// CHECK-NEXT:    torch.aten.mul.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f64> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @f64_scalar_beside_f32(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f64>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f64> -> !torch.float
  %1 = torch.aten.mul.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}

// -----

// Unknown consumers keep the ScalarImplicit; known ones still move to the tensor.

// CHECK-LABEL: func.func @unknown_consumer
// CHECK-NEXT:    %[[S:.*]] = torch.aten.ScalarImplicit %arg1
// CHECK-NEXT:    torch.aten.leaky_relu %arg0, %[[S]]
// CHECK-NEXT:    torch.aten.mul.Tensor %arg0, %arg1 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT:    return
func.func @unknown_consumer(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %0 = torch.aten.ScalarImplicit %arg1 : !torch.vtensor<[],f32> -> !torch.float
  %1 = torch.aten.leaky_relu %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  %2 = torch.aten.mul.Scalar %arg0, %0 : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %1, %2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// alpha beside a 0-d operand (LTC's `p + 1e-8` with eps as an f64 0-d input):
// an int alpha keeps the f64 of the product, so the rewrite is safe.

// CHECK-LABEL: func.func @alpha_beside_0d
// CHECK-NEXT:    %[[M:.*]] = torch.aten.mul.Tensor %arg1, %arg2 : !torch.vtensor<[],f64>, !torch.vtensor<[],si64> -> !torch.vtensor<[],f64>
// CHECK:         torch.aten.add.Tensor %arg0, %[[M]]
func.func @alpha_beside_0d(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[],f64>, %arg2: !torch.vtensor<[],si64>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.ScalarImplicit %arg2 : !torch.vtensor<[],si64> -> !torch.int
  %1 = torch.aten.add.Tensor %arg0, %arg1, %0 : !torch.vtensor<[4],f32>, !torch.vtensor<[],f64>, !torch.int -> !torch.vtensor<[4],f32>
  return %1 : !torch.vtensor<[4],f32>
}
