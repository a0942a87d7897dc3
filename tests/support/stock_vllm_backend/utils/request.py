"""Stand-in of the stock vLLM backend's ``utils/request.py`` (see ``../model.py``).

Shaped like the real module's generate request at Triton 25.12 to 26.08
(triton-inference-server/vllm_backend ``src/utils/request.py``): ``GenerateRequest(request,
executor_callback, output_dtype, logger, lora_repository=None, supported_loras=None)``,
``execute()`` an async generator of vLLM ``RequestOutput``s, and
``create_response(request_output, request_output_state, prepend_input)`` returning one
``pb_utils.InferenceResponse``. Only ``text_output`` (incremental, per choice),
``finish_reason`` and ``num_input_tokens`` are built here; written for these tests, not
copied. It never runs in product code.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from vllm.sampling_params import SamplingParams


def _flag(request: Any, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy()[0]) if tensor is not None else False


class GenerateRequest:
    def __init__(
        self,
        request: Any,
        executor_callback: Callable[..., AsyncIterator[Any]],
        output_dtype: Any,
        logger: Any,
        lora_repository: dict[str, str] | None = None,
        supported_loras: list[str] | None = None,
    ) -> None:
        self.triton_request = request
        self.executor_callback = executor_callback
        self.output_dtype = output_dtype
        self.logger = logger
        self.id = uuid.uuid4().hex
        self.stream = False
        self.prepend_input = False
        self.additional_outputs: dict[str, bool] = {}

    async def execute(self) -> AsyncIterator[Any]:
        request = self.triton_request
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
        self.stream = _flag(request, "stream")
        exclude = pb_utils.get_input_tensor_by_name(request, "exclude_input_in_output")
        self.prepend_input = not bool(exclude.as_numpy()[0]) if exclude is not None else True
        if self.stream and exclude is None:
            self.prepend_input = False
        params = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        text = params.as_numpy()[0].decode() if params is not None else request.parameters()
        sampling_params = SamplingParams(**json.loads(text))
        self.additional_outputs = {
            name: _flag(request, name)
            for name in (
                "return_finish_reason",
                "return_num_input_tokens",
                "return_num_output_tokens",
            )
        }
        async for output in self.executor_callback(
            {"prompt": prompt.decode()}, sampling_params, self.id, lora_request=None
        ):
            yield output

    def create_response(
        self, request_output: Any, request_output_state: dict[str, Any], prepend_input: bool
    ) -> Any:
        choices = request_output.outputs
        first = "sent_text" not in request_output_state
        sent = request_output_state.setdefault("sent_text", [0] * len(choices))
        head = request_output.prompt if first and prepend_input else ""
        text = [(head + c.text[sent[i] :]).encode() for i, c in enumerate(choices)]
        request_output_state["sent_text"] = [len(c.text) for c in choices]
        tensors = [pb_utils.Tensor("text_output", np.asarray(text, dtype=self.output_dtype))]
        if self.additional_outputs.get("return_finish_reason"):
            reasons = [str(c.finish_reason).encode() for c in choices]
            tensors.append(pb_utils.Tensor("finish_reason", np.asarray(reasons, dtype=np.object_)))
        if self.additional_outputs.get("return_num_input_tokens"):
            count = np.asarray(len(request_output.prompt_token_ids), dtype=np.uint32)
            tensors.append(pb_utils.Tensor("num_input_tokens", count))
        if self.additional_outputs.get("return_num_output_tokens"):
            # Each choice's tokens since its previous response, as the stock backend counts.
            before = request_output_state.setdefault("sent_tokens", [0] * len(choices))
            counts = [len(c.token_ids) - before[i] for i, c in enumerate(choices)]
            request_output_state["sent_tokens"] = [len(c.token_ids) for c in choices]
            tensors.append(
                pb_utils.Tensor("num_output_tokens", np.asarray(counts, dtype=np.uint32))
            )
        return pb_utils.InferenceResponse(output_tensors=tensors)
