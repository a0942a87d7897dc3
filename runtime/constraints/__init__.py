"""Per-request decoding constraints: schema, catalogs, the native engine and vLLM processors.

The batch engine is compiled from ``csrc/`` into ``runtime.constraints._engine``; the modules
here validate constraint configurations, size the engine's threads to the pod's CPUs, load
catalogs, and adapt the engine to vLLM's logits-processor interfaces.
"""

from runtime.constraints._engine import __version__ as engine_version
from runtime.constraints.threads import default_num_threads

__all__ = ["default_num_threads", "engine_version"]
