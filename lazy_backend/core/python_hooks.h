// PythonHooks: the Python functions the C++ backend calls: while compiling a
// graph, the node classifier (what is compilable) and the group compiler
// (fusion group subgraph -> executable); before every graph execution, the
// sync reporter. Set by lazy_mlir.init().
#pragma once

#include "runtime/python_callable.h"

namespace lazy_mlir {

struct PythonHooks {
  PythonCallable classify;       // (torch._C.Node) -> int (NodeClass)
  PythonCallable compile_group;  // (torch._C.Graph, str name) -> executable | None
  PythonCallable on_execute;     // (draws, host_draws) -> bool: before every graph execution; True under mark_step

  static PythonHooks& get();
};

}  // namespace lazy_mlir
