// How many worker threads the engine uses by default.
#pragma once

#include <cstddef>

namespace llm_serving {

// Environment variable that overrides the detected core count (a positive integer).
inline constexpr const char* kThreadsEnvVar = "LLM_SERVING_ENGINE_THREADS";

// Worker threads for the batch engine: LLM_SERVING_ENGINE_THREADS when set and valid,
// otherwise the hardware concurrency (at least 1).
std::size_t DefaultNumThreads();

}  // namespace llm_serving
