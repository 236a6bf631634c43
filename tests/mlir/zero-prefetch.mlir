// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=0}" | filecheck %s --check-prefix=NONE
// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=64,bucket-bytes=0}" | filecheck %s --check-prefix=AHEAD
// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=1000,bucket-bytes=0}" | filecheck %s --check-prefix=ALL
// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=1000,bucket-bytes=64}" | filecheck %s --check-prefix=BUCKET
// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=1000,bucket-bytes=0}" | filecheck %s --check-prefix=REUSE
// RUN: lazy-mlir-opt %s --split-input-file -p "zero-prefetch{budget-bytes=32,bucket-bytes=0}" | filecheck %s --check-prefix=REGATHER

// Three gathers of 32 bytes each (8 f32), as zero-insert-gather leaves
// them: each just before its wait, each wait just before its use.

// Budget 0: nothing moves.
// NONE:      %[[A:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0
// NONE-NEXT: torch.operator "torch._c10d_functional.wait_tensor"(%[[A]])
// NONE-NEXT: torch.aten.mul.Tensor
// NONE-NEXT: %[[B:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg1
// NONE-NEXT: torch.operator "torch._c10d_functional.wait_tensor"(%[[B]])

// Budget 64 bytes: two gathers in flight. The first two start at the top;
// the third starts right after the first one's wait.
// AHEAD:      %[[A:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0
// AHEAD-NEXT: %[[B:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg1
// AHEAD:      torch.operator "torch._c10d_functional.wait_tensor"(%[[A]])
// AHEAD-NEXT: %[[C:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg2
// AHEAD-NEXT: torch.aten.mul.Tensor
// AHEAD-NEXT: torch.operator "torch._c10d_functional.wait_tensor"(%[[B]])
// AHEAD:      torch.operator "torch._c10d_functional.wait_tensor"(%[[C]])

// Everything fits: all start at the top, in the order of their waits.
// ALL:      {{.*}}all_gather_into_tensor"(%arg0
// ALL-NEXT: {{.*}}all_gather_into_tensor"(%arg1
// ALL-NEXT: {{.*}}all_gather_into_tensor"(%arg2
// ALL-NEXT: torch.operator "torch._c10d_functional.wait_tensor"

// Small gathers started at one point become one while the bucket holds at
// most 64 bytes: shards of the first two concatenated, gathered once, waited
// before the first use, split back per rank; the third stays alone.
// BUCKET:      %[[L:.*]] = torch.prim.ListConstruct %arg0, %arg1 :
// BUCKET:      %[[CAT:.*]] = torch.aten.cat %[[L]], %{{.*}} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[8],f32>
// BUCKET-NEXT: %[[G:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%[[CAT]], {{.*}} -> !torch.vtensor<[16],f32>
// BUCKET-NEXT: %[[GC:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg2, {{.*}} -> !torch.vtensor<[8],f32>
// BUCKET:      %[[W:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[G]])
// BUCKET:      %[[ROWS:.*]] = torch.aten.view %[[W]], {{.*}} -> !torch.vtensor<[2,8],f32>
// BUCKET:      %[[P0:.*]] = torch.aten.slice.Tensor %[[ROWS]], {{.*}} -> !torch.vtensor<[2,4],f32>
// BUCKET:      %[[F0:.*]] = torch.aten.reshape %[[P0]], {{.*}} -> !torch.vtensor<[8],f32>
// BUCKET:      torch.aten.mul.Tensor %[[F0]], %[[F0]]
// BUCKET:      torch.operator "torch._c10d_functional.wait_tensor"(%[[GC]])
func.func @three_layers(%a: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[4],f32>, %c: !torch.vtensor<[4],f32>) -> !torch.vtensor<[8],f32> {
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %ga = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%a, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wa = torch.operator "torch._c10d_functional.wait_tensor"(%ga) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %x = torch.aten.mul.Tensor %wa, %wa : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  %gb = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%b, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wb = torch.operator "torch._c10d_functional.wait_tensor"(%gb) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %y = torch.aten.mul.Tensor %x, %wb : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  %gc = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%c, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wc = torch.operator "torch._c10d_functional.wait_tensor"(%gc) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %z = torch.aten.mul.Tensor %y, %wc : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  return %z : !torch.vtensor<[8],f32>
}

// -----

// %arg0 is gathered for its first use and again (a stage-3 re-gather) for
// the last. With room for all three in flight, the re-gather would start at
// the top, while the first copy is still in use: it takes that copy instead.
// REUSE-LABEL: func.func @regather
// REUSE:         %[[A:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0
// REUSE-NEXT:    %[[B:.*]] = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg1
// REUSE-NEXT:    %[[WA:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[A]])
// REUSE-NEXT:    %[[X:.*]] = torch.aten.mul.Tensor %[[WA]], %[[WA]]
// REUSE:         %[[WB:.*]] = torch.operator "torch._c10d_functional.wait_tensor"(%[[B]])
// REUSE:         torch.aten.mul.Tensor %{{.*}}, %[[WA]]
// REUSE-NOT:     all_gather_into_tensor
// With one gather in flight, the re-gather starts after %arg1's wait, when
// the first copy is dead: it stays.
// REGATHER-LABEL: func.func @regather
// REGATHER:         torch.operator "torch._c10d_functional.wait_tensor"
// REGATHER:         torch.operator "torch._c10d_functional.wait_tensor"
// REGATHER-NEXT:    torch.operator "torch._c10d_functional.all_gather_into_tensor"(%arg0
func.func @regather(%a: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[4],f32>) -> !torch.vtensor<[8],f32> {
  %int2 = torch.constant.int 2
  %str = torch.constant.str "0"
  %ga = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%a, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wa = torch.operator "torch._c10d_functional.wait_tensor"(%ga) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %x = torch.aten.mul.Tensor %wa, %wa : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  %gb = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%b, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wb = torch.operator "torch._c10d_functional.wait_tensor"(%gb) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %y = torch.aten.mul.Tensor %x, %wb : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  %ga2 = torch.operator "torch._c10d_functional.all_gather_into_tensor"(%a, %int2, %str) : (!torch.vtensor<[4],f32>, !torch.int, !torch.str) -> !torch.vtensor<[8],f32>
  %wa2 = torch.operator "torch._c10d_functional.wait_tensor"(%ga2) : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %z = torch.aten.mul.Tensor %y, %wa2 : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  return %z : !torch.vtensor<[8],f32>
}
