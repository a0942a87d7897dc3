"""The ``model.py`` Triton loads for ``backend: "llm_serving_vllm"``.

The serving Dockerfile copies this file to ``/opt/tritonserver/backends/llm_serving_vllm/``;
the backend itself is :mod:`runtime.serving_backend.scoring`, installed with the runtime.
"""

from runtime.serving_backend.scoring import TritonPythonModel

__all__ = ["TritonPythonModel"]
