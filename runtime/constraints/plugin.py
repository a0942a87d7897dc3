"""The one class vLLM's ``vllm.logits_processors`` entry point names, for either model runner.

vLLM loads every class of that group into each engine: the V1 model runner constructs it as
``cls(vllm_config, device, is_pin_memory)``, Model Runner V2 (vLLM >= 0.32) as
``cls(vllm_config, req_states)``. Each runner's loaders check that a class derives from that
runner's ``LogitsProcessor`` (V1's name loader, which reads ``logits_processors`` in
``model.json``, does; its entry-point loader does not), so this class derives from both
interfaces wherever vLLM ships them and builds the processor that matches the constructor call:
one installed package, or one name, serves both runners.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor

from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.runner_v2 import ConstraintLogitsProcessorV2, RunnerV2Processor

__all__ = ["ConstraintProcessorEntryPoint"]


_BASES: tuple[type, ...] = (
    (LogitsProcessor,) if RunnerV2Processor is object else (LogitsProcessor, RunnerV2Processor)
)


class ConstraintProcessorEntryPoint(*_BASES):  # type: ignore[misc]
    """Builds :class:`ConstraintLogitsProcessor` (V1) or :class:`ConstraintLogitsProcessorV2`."""

    validate_params = ConstraintLogitsProcessor.validate_params

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc,unused-ignore]
        if len(args) + len(kwargs) == 1:
            return ConstraintLogitsProcessorV2(vllm_config, *args, **kwargs)
        return ConstraintLogitsProcessor(vllm_config, *args, **kwargs)
