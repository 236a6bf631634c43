// SourceLocations: makes LTC record, for every traced op, the innermost
// Python frame of user code (skipping torch and lazy_mlir internals), so
// that errors and warnings point at the line that created the op. LTC's own
// frame function reports the outermost frame (e.g. runpy's), which names no
// useful line.
#pragma once

#include <string>
#include <vector>

namespace lazy_mlir {

// Installs the frame function; frames whose file starts with one of
// `internal_prefixes` are skipped.
void installSourceLocations(std::vector<std::string> internal_prefixes);

}  // namespace lazy_mlir
