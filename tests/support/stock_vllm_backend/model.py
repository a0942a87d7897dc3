"""Stand-in of NVIDIA's stock Triton vLLM backend (``/opt/tritonserver/backends/vllm/``).

The real backend runs under real Triton in the tests (``tests/support/real_triton.py``); this
stand-in serves the ``llm_serving_vllm`` backend's unit tests, which run in this interpreter
without Triton's stub. It has the real backend's shape where ours depends
on it (triton-inference-server/vllm_backend ``src/model.py`` at Triton 25.12 to 26.08):
``TritonPythonModel.auto_complete_config`` (a classmethod adding the stock inputs and outputs
the configuration lacks, forcing decoupled and ``max_batch_size 0``), ``initialize(args)``
(reading ``model_config`` and the ``text_output`` dtype), and ``_infer(request)``, which
builds its request through the module-level name ``GenerateRequest`` (imported from
``utils.request``, resolved through the folder on ``sys.path``) and sends either every
``create_response(...)`` (streaming) or only the last one, with
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. The engine is :class:`tests.support.toy_vllm_engine.
ToyEngine` (vLLM's real output classes, the toy model's numbers); ``execute`` runs each
request to completion instead of on an engine thread. Written for these tests, not copied.
It never runs in product code.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import triton_python_backend_utils as pb_utils
from utils.request import GenerateRequest

from tests.support.toy_vllm_engine import ToyEngine

_INPUTS = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
    *(
        {"name": name, "data_type": kind, "dims": [1], "optional": True}
        for name, kind in (
            ("stream", "TYPE_BOOL"),
            ("sampling_parameters", "TYPE_STRING"),
            ("exclude_input_in_output", "TYPE_BOOL"),
            ("return_finish_reason", "TYPE_BOOL"),
            ("return_cumulative_logprob", "TYPE_BOOL"),
            ("return_logprobs", "TYPE_BOOL"),
            ("return_num_input_tokens", "TYPE_BOOL"),
            ("return_num_output_tokens", "TYPE_BOOL"),
            ("embedding_request", "TYPE_STRING"),
        )
    ),
    {"name": "image", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
]
_OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
]


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        cls._auto_complete_inputs_and_outputs(auto_complete_model_config)
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=True))
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    @staticmethod
    def _auto_complete_inputs_and_outputs(auto_complete_model_config: Any) -> None:
        config = auto_complete_model_config.as_dict()
        have_inputs = {t["name"] for t in config["input"]}
        have_outputs = {t["name"] for t in config["output"]}
        for tensor in _INPUTS:
            if tensor["name"] not in have_inputs:
                auto_complete_model_config.add_input(tensor)
        for tensor in _OUTPUTS:
            if tensor["name"] not in have_outputs:
                auto_complete_model_config.add_output(tensor)

    def initialize(self, args: dict[str, Any]) -> None:
        self.args = args
        self.logger = pb_utils.Logger
        self.model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(self.model_config, "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self._llm_engine = ToyEngine()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            asyncio.run(self._infer(request))

    async def _infer(self, request: Any) -> None:
        sender = request.get_response_sender()
        generate = GenerateRequest(
            request, self._llm_engine.generate, self.output_dtype, self.logger
        )
        state: dict[str, Any] = {}
        last = None
        async for last in generate.execute():
            if generate.stream:
                response = generate.create_response(last, state, prepend_input=False)
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last.finished else 0
                sender.send(response, flags)
        if not generate.stream:
            response = generate.create_response(
                request_output=last, request_output_state={}, prepend_input=generate.prepend_input
            )
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.logger.log_info("[vllm] Issuing finalize to vllm backend")
