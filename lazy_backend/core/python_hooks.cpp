#include "core/python_hooks.h"

namespace lazy_mlir {

PythonHooks& PythonHooks::get() {
  // Leaked on purpose: released objects would need the GIL at static destruction.
  static PythonHooks* hooks = new PythonHooks();
  return *hooks;
}

}  // namespace lazy_mlir
