#include "llm_serving/parallelism.h"

#include <cstdlib>
#include <string>
#include <thread>

namespace llm_serving {

std::size_t DefaultNumThreads() {
  if (const char* value = std::getenv(kThreadsEnvVar)) {
    // An unparsable or non-positive override is ignored rather than fatal: the engine must
    // still start, and the Python side reports the value it actually uses.
    char* end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (end != value && *end == '\0' && parsed > 0) {
      return static_cast<std::size_t>(parsed);
    }
  }
  const unsigned detected = std::thread::hardware_concurrency();
  return detected == 0 ? 1 : detected;
}

}  // namespace llm_serving
