// SilentWarnings: a c10 warning handler that drops what it takes. Installed
// (c10::WarningUtils::WarningHandlerGuard) around a Lazy kernel registration
// that replaces LTC's on purpose, where the dispatcher's "Overriding a
// previously registered kernel" warning is expected.
#pragma once

#include <c10/util/Exception.h>

namespace lazy_mlir {

class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace lazy_mlir
