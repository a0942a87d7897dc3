// Python bindings for the constraint engine; declarations only, glue lives in free functions.
#include <pybind11/pybind11.h>

#include "llm_serving/parallelism.h"

namespace py = pybind11;

PYBIND11_MODULE(_engine, m) {
  m.doc() = "Native constraint engine of llm-serving.";
  m.attr("__version__") = LLM_SERVING_VERSION;
  m.attr("THREADS_ENV_VAR") = llm_serving::kThreadsEnvVar;
  m.def("default_num_threads", &llm_serving::DefaultNumThreads,
        "Worker threads the engine uses: LLM_SERVING_ENGINE_THREADS, else the core count.");
}
