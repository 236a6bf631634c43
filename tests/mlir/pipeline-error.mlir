// Pipeline specs are checked before any input is read.

// RUN: not lazy-mlir-opt %s -p fold-copy-ops,no-such-pass 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN: error: unknown pass 'no-such-pass'; known passes: {{.*}}fold-copy-ops{{.*}}

// RUN: not lazy-mlir-opt %s -p "canonicalize{no-such-option=1}" 2>&1 | filecheck %s --check-prefix=OPTION
// OPTION: error: pass 'canonicalize': bad option 'no-such-option=1'; its options: max-iterations (int), top-down (bool)

// RUN: not lazy-mlir-opt %s -p "canonicalize{max-iterations=many}" 2>&1 | filecheck %s --check-prefix=VALUE
// VALUE: error: pass 'canonicalize': option max-iterations expects int, got 'many'

// RUN: not lazy-mlir-opt %s -p "cse{" 2>&1 | filecheck %s --check-prefix=BRACES
// BRACES: error: unbalanced braces in pipeline 'cse{'

// RUN: not lazy-mlir-opt %s -p "fold-copy-ops,,cse" 2>&1 | filecheck %s --check-prefix=EMPTY
// EMPTY: error: bad pipeline element '' in 'fold-copy-ops,,cse'

// Input that does not parse is reported the same way.

// RUN: echo "func.func @broken(" | not lazy-mlir-opt - -p cse 2>&1 | filecheck %s --check-prefix=PARSE
// PARSE: error: Unable to parse module assembly

func.func @unused() {
  return
}
