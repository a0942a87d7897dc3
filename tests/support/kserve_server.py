"""A stand-in for Triton Inference Server + its vLLM backend, speaking KServe v2 gRPC.

Real Triton runs in the tests (``tests/support/real_triton.py``, the whole pod in
``tests/runtime/test_pod_real_triton.py``); this stand-in stays where a test must force what a
real model or server will not do on purpose: scripted replies (tool calls), exact texts, a
failure, a delay or a readiness change at a chosen moment, in milliseconds instead of a minute's
start. It is a real gRPC server on
``tritonclient.grpc.service_pb2_grpc`` (the same service definitions Triton serves) that
answers ``ServerLive``/``ServerReady``/``ModelReady``/``ModelMetadata``/``ModelConfig``,
``grpc.health.v1.Health/Check``, ``ModelInfer`` and ``ModelStreamInfer`` with the vLLM
backend's tensors (``text_input``, ``stream``, ``sampling_parameters``,
``exclude_input_in_output``, ``return_*``, ``embedding_request``) and outputs, and rejects
unknown sampling-parameter keys as the backend does. A deterministic toy model
(:mod:`tests.support.toy_model`) generates the text. The repository's other models (FIL's
XGBoost and LightGBM, onnxruntime, TorchScript, ensembles) are executed for real by their own
libraries, with dynamic batching (:mod:`tests.support.repository_models`), so one client can call
an LLM and a tabular model alike. It never runs in product code.

Run as a ``tritonserver`` stand-in: ``python -m tests.support.kserve_server
--model-repository DIR --grpc-port N --load-model NAME ...``. Its command line is parsed as
tritonserver parses it (every real flag accepted, an unknown or misspelled one or a malformed
value refused with exit 1), and ``KSERVE_STANDIN_REQUIRE_POD_FLAGS=1`` also requires every flag
the serving entrypoint relies on (`tests.support.triton_flags.POD_FLAGS`). The load time comes from
``KSERVE_STANDIN_LOAD_SECONDS``, spent before any port is bound as Triton does (its endpoints
start once the startup models have loaded); ``KSERVE_STANDIN_BIND_EARLY=1`` binds first and
reports not ready until the load time has passed, like a server that binds early. With
``KSERVE_STANDIN_RECORD`` set to a file path, every inference request received is appended
there as one JSON line (a :class:`RecordedRequest`), so tests that run it as a separate process
can see what reached "Triton".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from runtime.serving_backend import BACKEND_NAME as SCORING_BACKEND
from runtime.serving_backend import (
    CACHE_SALT_PARAMETER,
    CACHED_TOKENS_OUTPUT,
    STOP_REASON_OUTPUT,
)
from tests.support.repository_models import (
    BackendFailure,
    InvalidInput,
    ModelRepository,
    read_config,
)
from tests.support.toy_model import VOCAB, ToyChoice, ToyModel, ToyPrefixCache
from tests.support.triton_flags import TRUE_WORDS, FlagError, check_pod_flags, parse_triton_flags

__all__ = [
    "HEALTH_CHECK_METHOD",
    "HEALTH_SERVING",
    "SAMPLING_PARAMETER_KEYS",
    "KServeStandIn",
    "RecordedRequest",
    "StandInModel",
    "load_models",
    "main",
]

# vLLM 0.27.1 ``SamplingParams`` fields plus the backend's own keys (``lora_name``,
# ``guided_decoding``); any other key makes the backend reject the request.
SAMPLING_PARAMETER_KEYS: frozenset[str] = frozenset(
    {
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "flat_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
        "structured_outputs",
        "logit_bias",
        "allowed_token_ids",
        "extra_args",
        "bad_words",
        "skip_clone",
        "skip_reading_prefix_cache",
        "logprob_token_ids",
        "output_text_buffer_length",
        "repetition_detection",
        "routed_experts_prompt_start",
        "stream_interval",
        "thinking_token_budget",
        "_all_stop_token_ids",
        "_bad_words_token_ids",
        "_eos_token_id",
        "lora_name",
        "guided_decoding",
    }
)

_GENERATE_OUTPUTS = (
    ("text_output", "BYTES"),
    ("finish_reason", "BYTES"),
    ("cumulative_logprob", "FP32"),
    ("logprobs", "BYTES"),
    ("num_input_tokens", "UINT32"),
    ("num_output_tokens", "UINT32"),
)
_INPUTS = (
    ("text_input", "BYTES", [1], False),
    ("image", "BYTES", [-1], True),
    ("stream", "BOOL", [1], True),
    ("sampling_parameters", "BYTES", [1], True),
    ("exclude_input_in_output", "BOOL", [1], True),
    ("return_finish_reason", "BOOL", [1], True),
    ("return_cumulative_logprob", "BOOL", [1], True),
    ("return_logprobs", "BOOL", [1], True),
    ("return_num_input_tokens", "BOOL", [1], True),
    ("return_num_output_tokens", "BOOL", [1], True),
    ("embedding_request", "BYTES", [1], True),
)
# Not an output of the stock backend: declared by the serving image's backend (or in
# config.pbtxt) for vLLM's prompt log-probabilities, which the frontend's scoring reads.
PROMPT_LOGPROBS_OUTPUT = "prompt_logprobs"
_EXTRA_TYPES = {
    PROMPT_LOGPROBS_OUTPUT: "BYTES",
    CACHED_TOKENS_OUTPUT: "UINT32",
    STOP_REASON_OUTPUT: "BYTES",
}
# The backends a config.pbtxt may name: NVIDIA's vLLM backend, and ours built on it.
_BACKENDS = frozenset({"vllm", SCORING_BACKEND})


@dataclass
class StandInModel:
    """One served model: its name, toy model and the optional outputs its config declares."""

    name: str
    toy: ToyModel = field(default_factory=ToyModel)
    extra_outputs: tuple[str, ...] = (
        PROMPT_LOGPROBS_OUTPUT,
        CACHED_TOKENS_OUTPUT,
        STOP_REASON_OUTPUT,
    )
    max_model_len: int = 512
    backend: str = SCORING_BACKEND
    prefix_cache: ToyPrefixCache = field(default_factory=ToyPrefixCache)


@dataclass(frozen=True)
class RecordedRequest:
    """What the stand-in received for one inference request, for tests to assert on."""

    model: str
    rpc: str
    text_input: str | None
    flags: dict[str, bool]
    sampling_parameters: dict[str, Any]
    requested_outputs: tuple[str, ...]
    embedding_request: dict[str, Any] | None
    request_id: str = ""
    #: The request's string parameters (``cache_salt``).
    parameters: dict[str, str] = field(default_factory=dict)


class BackendError(Exception):
    """An error response from the backend (Triton's ``Error generating stream: ...``)."""


def _dtype(datatype: str) -> Any:
    return {"BOOL": np.bool_, "UINT32": np.uint32, "FP32": np.float32, "INT64": np.int64}[datatype]


def _read_inputs(request: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        if i < len(request.raw_input_contents):
            raw = request.raw_input_contents[i]
            if tensor.datatype == "BYTES":
                values[tensor.name] = deserialize_bytes_tensor(raw)
            else:
                values[tensor.name] = np.frombuffer(raw, dtype=_dtype(tensor.datatype))
        elif tensor.datatype == "BYTES":
            values[tensor.name] = np.array(list(tensor.contents.bytes_contents), dtype=np.object_)
        else:
            values[tensor.name] = np.array(list(tensor.contents.bool_contents))
    return values


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, owner: KServeStandIn) -> None:
        self.owner = owner

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.owner.ready)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=self.owner.model_ready(request.name))

    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(
            name="triton", version="2.61.0", extensions=["classification", "sequence"]
        )

    async def ModelMetadata(self, request, context):
        if request.name in self.owner.repository.models and self.owner.ready:
            return self.owner.repository.models[request.name].metadata()
        model = await self._model(request.name, context)
        return service_pb2.ModelMetadataResponse(
            name=model.name,
            versions=["1"],
            platform="vllm",
            inputs=[
                service_pb2.ModelMetadataResponse.TensorMetadata(name=n, datatype=d, shape=s)
                for n, d, s, _ in _INPUTS
            ],
            outputs=[
                service_pb2.ModelMetadataResponse.TensorMetadata(name=n, datatype=d, shape=[-1])
                for n, d in self.owner.outputs_of(model)
            ],
        )

    async def ModelConfig(self, request, context):
        if request.name in self.owner.repository.models and self.owner.ready:
            config = self.owner.repository.models[request.name].config
            return service_pb2.ModelConfigResponse(config=config)
        model = await self._model(request.name, context)
        config = model_config_pb2.ModelConfig(
            name=model.name, backend=model.backend, max_batch_size=0
        )
        config.model_transaction_policy.decoupled = True
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request, context):
        if request.model_name in self.owner.repository.models and self.owner.ready:
            try:
                return await self.owner.repository.handle(request)
            except InvalidInput as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except BackendFailure as exc:
                await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        model = await self._model(request.model_name, context)
        last = None
        try:
            async for response, _final in self.owner.run(model, request, "ModelInfer"):
                last = response
        except BackendError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        return last

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            if request.model_name in self.owner.repository.models and self.owner.ready:
                try:
                    response = await self.owner.repository.handle(request)
                except (InvalidInput, BackendFailure) as exc:
                    yield service_pb2.ModelStreamInferResponse(error_message=str(exc))
                else:
                    yield service_pb2.ModelStreamInferResponse(infer_response=response)
                continue
            model = self.owner.models.get(request.model_name)
            if model is None or not self.owner.ready:
                yield service_pb2.ModelStreamInferResponse(
                    error_message=f"Request for unknown model: '{request.model_name}' is not found"
                )
                continue
            final = _final_flag_requested(request)
            try:
                async for response, last in self.owner.run(model, request, "ModelStreamInfer"):
                    if final:
                        response.parameters["triton_final_response"].bool_param = last
                    yield service_pb2.ModelStreamInferResponse(infer_response=response)
            except BackendError as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=str(exc))

    async def _model(self, name: str, context) -> StandInModel:
        model = self.owner.models.get(name)
        if model is None or not self.owner.ready:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"Request for unknown model: '{name}' is not found"
            )
        return model


def _final_flag_requested(request: service_pb2.ModelInferRequest) -> bool:
    param = request.parameters.get("triton_enable_empty_final_response")
    return bool(param and param.bool_param)


# grpc.health.v1.HealthCheckResponse.status (field 1, varint): SERVING = 1, NOT_SERVING = 2.
# Encoded by hand: the message is one enum, and grpcio-health-checking needs protobuf 7.
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
HEALTH_SERVING = b"\x08\x01"
HEALTH_NOT_SERVING = b"\x08\x02"


def _health_handler(owner: KServeStandIn) -> grpc.GenericRpcHandler:
    async def check(request: bytes, context) -> bytes:
        return HEALTH_SERVING if owner.ready else HEALTH_NOT_SERVING

    method = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": method})


class KServeStandIn:
    """The stand-in server: start it in a background thread, read ``port``, ``stop()`` it.

    ``requests`` records every LLM inference request received and ``cancelled`` counts requests
    whose client went away before the last response, so tests can prove a mapping.
    ``repository`` holds the non-LLM models it executes; with neither, it serves one toy LLM.
    """

    def __init__(
        self,
        models: Sequence[StandInModel] = (),
        *,
        repository: ModelRepository | None = None,
        load_seconds: float = 0.0,
        token_delay_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        record_path: Path | None = None,
    ) -> None:
        self.repository = repository if repository is not None else ModelRepository()
        if not models and not self.repository.models:
            models = [StandInModel("toy")]
        self.models = {m.name: m for m in models}
        self.record_path = record_path
        self.load_seconds = load_seconds
        self.token_delay_s = token_delay_s
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        self.cancelled = 0
        self.in_flight = 0
        self._started_at = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self.serving = False
        """Set once the gRPC port listens (``port`` is known before: a fixed one is given)."""

    @property
    def ready(self) -> bool:
        return time.monotonic() - self._started_at >= self.load_seconds

    def model_ready(self, name: str) -> bool:
        return self.ready and (name in self.models or name in self.repository.models)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def outputs_of(self, model: StandInModel) -> list[tuple[str, str]]:
        return [*_GENERATE_OUTPUTS, *((o, _EXTRA_TYPES[o]) for o in model.extra_outputs)]

    async def serve(self) -> None:
        """Bind and serve until :meth:`shutdown`; sets ``port`` once bound."""
        self._loop = asyncio.get_running_loop()
        self._server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self), self._server)
        self._server.add_generic_rpc_handlers((_health_handler(self),))
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")
        self._started_at = time.monotonic()
        await self._server.start()
        self.serving = True
        await self._server.wait_for_termination()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting requests and let in-flight ones finish within ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)

    def start(self) -> KServeStandIn:
        """Serve in a daemon thread; returns once the port listens."""
        bound = threading.Event()

        def run() -> None:
            async def main() -> None:
                task = asyncio.ensure_future(self.serve())
                while not self.serving and not task.done():
                    await asyncio.sleep(0.005)
                bound.set()
                await task

            asyncio.run(main())

        self._thread = threading.Thread(target=run, name="kserve-standin", daemon=True)
        self._thread.start()
        if not bound.wait(30):  # a thread start and a bind: seconds only on a loaded machine
            raise RuntimeError("KServe stand-in did not bind within 30 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            # The loop ends as soon as the server stops, so the shutdown future is not awaited.
            asyncio.run_coroutine_threadsafe(self.shutdown(0.5), self._loop)
            self._thread.join(10)

    async def run(
        self, model: StandInModel, request: service_pb2.ModelInferRequest, rpc: str
    ) -> AsyncIterator[tuple[service_pb2.ModelInferResponse, bool]]:
        """Run one request like the vLLM backend; yields each response and whether it is last."""
        inputs = _read_inputs(request)
        flags = {
            name: bool(inputs[name][0])
            for name, datatype, _, _ in _INPUTS
            if datatype == "BOOL" and name in inputs
        }
        embedding = inputs.get("embedding_request")
        embedding_request = json.loads(embedding[0]) if embedding is not None else None
        params_raw = inputs.get("sampling_parameters")
        params = json.loads(params_raw[0]) if params_raw is not None else {}
        text = inputs.get("text_input")
        prompt = text[0].decode("utf-8") if text is not None else None
        requested = tuple(o.name for o in request.outputs)
        parameters = {k: v.string_param for k, v in request.parameters.items() if v.string_param}
        recorded = RecordedRequest(
            model.name,
            rpc,
            prompt,
            flags,
            params,
            requested,
            embedding_request,
            request.id,
            parameters,
        )
        self.requests.append(recorded)
        if self.record_path is not None:
            with self.record_path.open("a", encoding="utf-8") as record:
                record.write(json.dumps(dataclasses.asdict(recorded)) + "\n")
        known = {name for name, _ in self.outputs_of(model)}
        for name in requested:
            if name not in known:
                raise BackendError(f"unexpected inference output '{name}' for model '{model.name}'")
        self.in_flight += 1
        finished = False
        try:
            if embedding_request is not None:
                yield self._embedding_response(model, request, embedding_request, flags)
            else:
                if prompt is None:
                    raise BackendError("expected 1 inputs but got 0 inputs for model: text_input")
                async for response in self._generate(model, request, prompt, params, flags):
                    yield response
            finished = True
        finally:
            # Counted before in_flight drops: a test thread that sees in_flight == 0 then reads
            # a cancellation that is already counted.
            if not finished:
                self.cancelled += 1
            self.in_flight -= 1

    def _embedding_response(self, model, request, embedding_request, flags):
        text = embedding_request["input"]
        text = text if isinstance(text, str) else " ".join(map(str, text))
        dims = embedding_request.get("pooling_params", {}).get("dimensions")
        if dims and not 1 <= dims[0] <= model.toy.embedding_dim:
            raise BackendError(
                f"Error generating stream: dimensions {dims[0]} is out of range [1, "
                f"{model.toy.embedding_dim}]"
            )
        vector = model.toy.embed(text, dims[0] if dims else None)
        outputs = {"text_output": [json.dumps(vector).encode()]}
        if flags.get("return_num_input_tokens"):
            outputs["num_input_tokens"] = [len(model.toy.tokenize(text))]
        if flags.get("return_num_output_tokens"):
            outputs["num_output_tokens"] = [0]
        return self._response(model, request, outputs, final=True)

    async def _generate(self, model, request, prompt, params, flags):
        unknown = sorted(set(params) - SAMPLING_PARAMETER_KEYS)
        if unknown:
            raise BackendError(
                "Error generating stream: TritonSamplingParams.__init__() got an unexpected "
                f"keyword argument '{unknown[0]}'"
            )
        params = {k: v for k, v in params.items() if v is not None}
        stream = flags.get("stream", False)
        exclude = flags.get("exclude_input_in_output")
        prepend = (not exclude) if exclude is not None else not stream
        if prepend and stream:
            raise BackendError(
                "Error generating stream: When streaming, `exclude_input_in_output` = False is "
                "not allowed."
            )
        prompt_len = len(model.toy.tokenize(prompt))
        max_tokens = params.get("max_tokens")
        if prompt_len + (max_tokens or 16) > model.max_model_len:
            raise BackendError(
                f"Error generating stream: This model's maximum context length is "
                f"{model.max_model_len} tokens. However, you requested "
                f"{prompt_len + (max_tokens or 16)} tokens."
            )
        for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            if key in params and not isinstance(params[key], int | float):
                raise BackendError(f"Error generating stream: {key} must be a number")
        # As the llm_serving_vllm backend: the salt reaches the engine (the stock one ignores
        # request parameters beside a sampling_parameters tensor).
        salt = None
        if (
            CACHED_TOKENS_OUTPUT in model.extra_outputs
            and CACHE_SALT_PARAMETER in request.parameters
        ):
            salt = request.parameters[CACHE_SALT_PARAMETER].string_param or None
        cached = model.prefix_cache.lookup(model.toy.tokenize(prompt), salt)
        respond = functools.partial(
            self._generate_response,
            model,
            request,
            params=params,
            flags=flags,
            prompt=prompt,
            cached=cached,
        )
        try:
            steps = model.toy.generate(prompt, params)
            sent = [0] * int(params.get("n", 1))
            sent_steps = [0] * len(sent)
            choices: list[ToyChoice] = []
            for choices in steps:
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                else:
                    await asyncio.sleep(0)
                if stream:
                    done = all(c.finish_reason is not None for c in choices)
                    yield respond(choices, sent, sent_steps, "", done)
            if not stream:
                unsent = [0] * len(choices)
                yield respond(choices, unsent, list(unsent), prompt if prepend else "", True)
        except (ValueError, TypeError) as exc:
            raise BackendError(f"Error generating stream: {exc}") from exc

    def _generate_response(
        self,
        model,
        request,
        choices,
        sent,
        sent_steps,
        prefix,
        final,
        *,
        params,
        flags,
        prompt,
        cached,
    ):
        outputs: dict[str, list[Any]] = {
            "text_output": [
                (prefix + c.text[sent[i] :]).encode("utf-8") for i, c in enumerate(choices)
            ]
        }
        if flags.get("return_finish_reason"):
            outputs["finish_reason"] = [str(c.finish_reason).encode() for c in choices]
        if flags.get("return_cumulative_logprob"):
            outputs["cumulative_logprob"] = [c.cumulative_logprob for c in choices]
        if flags.get("return_logprobs"):
            outputs["logprobs"] = [
                json.dumps(
                    [
                        {
                            str(tid): {
                                "logprob": lp,
                                "rank": 1 + sum(v > lp for v in s.top.values()),
                                "decoded_token": VOCAB[tid],
                            }
                            for tid, lp in [(s.token_id, s.logprob), *s.top.items()]
                        }
                        for s in c.steps[sent_steps[i] :]
                    ]
                    if params.get("logprobs") is not None
                    else None
                ).encode()
                for i, c in enumerate(choices)
            ]
        if flags.get("return_num_input_tokens"):
            outputs["num_input_tokens"] = [len(model.toy.tokenize(prompt))]
        if flags.get("return_num_output_tokens"):
            outputs["num_output_tokens"] = [
                len(c.steps) - sent_steps[i] for i, c in enumerate(choices)
            ]
        if final and CACHED_TOKENS_OUTPUT in model.extra_outputs:
            outputs[CACHED_TOKENS_OUTPUT] = [cached]
        finished = any(c.finish_reason is not None for c in choices)
        if finished and STOP_REASON_OUTPUT in model.extra_outputs:
            outputs[STOP_REASON_OUTPUT] = [json.dumps(c.stop_reason).encode() for c in choices]
        requested = {o.name for o in request.outputs}
        if PROMPT_LOGPROBS_OUTPUT in requested:
            if params.get("prompt_logprobs") is None:
                raise BackendError("Error generating stream: prompt_logprobs was not requested")
            outputs[PROMPT_LOGPROBS_OUTPUT] = [
                json.dumps(
                    [
                        None
                        if d is None
                        else {
                            str(k): {
                                "logprob": v,
                                "rank": 1 + sum(other > v for other in d.values()),
                                "decoded_token": VOCAB[k],
                            }
                            for k, v in d.items()
                        }
                        for d in model.toy.prompt_logprobs(prompt, params["prompt_logprobs"])
                    ]
                ).encode()
            ]
        for i, c in enumerate(choices):
            sent[i] = len(c.text)
            sent_steps[i] = len(c.steps)
        return self._response(model, request, outputs, final=final)

    def _response(self, model, request, outputs, *, final: bool):
        requested = [o.name for o in request.outputs]
        if requested:
            outputs = {k: v for k, v in outputs.items() if k in requested}
        kinds = dict(self.outputs_of(model))
        response = service_pb2.ModelInferResponse(
            model_name=model.name, model_version="1", id=request.id
        )
        for name, values in outputs.items():
            datatype = kinds[name]
            if datatype == "BYTES":
                raw = serialize_byte_tensor(np.array(values, dtype=np.object_)).item()
            else:
                raw = np.array(values, dtype=_dtype(datatype)).tobytes()
            response.outputs.add(name=name, datatype=datatype, shape=[len(values)])
            response.raw_output_contents.append(raw)
        return response, final


class _HttpHealth(BaseHTTPRequestHandler):
    owner: KServeStandIn

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        match = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/\d+)?/ready", path)
        if path == "/v2/health/live":
            ok = True
        elif path == "/v2/health/ready":
            ok = self.owner.ready
        elif match:
            ok = self.owner.model_ready(match.group(1))
        else:
            self.send_error(404)
            return
        self.send_response(200 if ok else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@dataclass(frozen=True)
class _Args:
    """The flags the stand-in acts on (defaults as tritonserver's, but loopback addresses)."""

    repositories: list[Path]
    load_model: list[str]
    model_control_mode: str
    grpc_address: str
    grpc_port: int
    http_address: str
    http_port: int
    allow_http: bool
    exit_timeout_secs: int

    @classmethod
    def of(cls, given: dict[str, list[str]]) -> _Args:
        def last(name: str, default: str) -> str:
            return given.get(name, [default])[-1]

        repositories = [
            Path(p) for p in given.get("model-store", []) + given.get("model-repository", [])
        ]
        if not repositories:
            raise FlagError("error: --model-repository must be specified")
        # Loopback, not 0.0.0.0 as in tritonserver: a test never opens a port to the network.
        return cls(
            repositories=repositories,
            load_model=given.get("load-model", []),
            model_control_mode=last("model-control-mode", "none").lower(),
            grpc_address=last("grpc-address", "127.0.0.1"),
            grpc_port=int(last("grpc-port", "8001")),
            http_address=last("http-address", "127.0.0.1"),
            http_port=int(last("http-port", "8000")),
            allow_http=last("allow-http", "true").lower() in TRUE_WORDS,
            exit_timeout_secs=int(last("exit-timeout-secs", "30")),
        )


def load_models(
    repositories: Sequence[Path], names: Sequence[str], mode: str
) -> tuple[list[StandInModel], ModelRepository]:
    """Read ``config.pbtxt`` of each model to load: every model in the repositories, unless
    mode is explicit (then the ``--load-model`` ones, which tritonserver ignores otherwise).
    vLLM-backend models become toy LLMs; the others load into the repository of executed ones."""
    found: dict[str, Path] = {}
    for repository in repositories:
        for model in sorted(repository.iterdir()) if repository.is_dir() else ():
            if (model / "config.pbtxt").is_file():
                found.setdefault(model.name, model / "config.pbtxt")
    if mode != "explicit":
        names = sorted(found)
    models = []
    executed = ModelRepository()
    for name in names:
        config = found.get(name, repositories[0] / name / "config.pbtxt")
        if not config.is_file():
            raise FileNotFoundError(f"failed to load '{name}': {config} does not exist")
        text = config.read_text()
        backend = re.search(r'backend:\s*"([^"]+)"', text)
        if backend is None or backend.group(1) not in _BACKENDS:
            if not ModelRepository.serves(read_config(config.parent)):
                raise ValueError(
                    f"failed to load '{name}': {config} sets no backend of {sorted(_BACKENDS)} "
                    "and is no fil, onnxruntime, pytorch or ensemble model"
                )
            executed.load(config.parent)
            continue
        declared = re.findall(r'name:\s*"([^"]+)"', text)
        # The serving image's backend declares its outputs in its auto-complete
        # (tests/serving_backend checks it does); the stock one declares
        # prompt_logprobs only if config.pbtxt does.
        if backend.group(1) == SCORING_BACKEND:
            extra: tuple[str, ...] = (
                PROMPT_LOGPROBS_OUTPUT,
                CACHED_TOKENS_OUTPUT,
                STOP_REASON_OUTPUT,
            )
        elif PROMPT_LOGPROBS_OUTPUT in declared:
            extra = (PROMPT_LOGPROBS_OUTPUT,)
        else:
            extra = ()
        models.append(StandInModel(name, extra_outputs=extra, backend=backend.group(1)))
    return models, executed


def main(argv: Sequence[str] | None = None) -> int:
    """Run as ``tritonserver``; returns the exit status (1 for a command line it refuses)."""
    try:
        given = parse_triton_flags(sys.argv[1:] if argv is None else argv)
        args = _Args.of(given)
    except FlagError as exc:
        print(f"{exc}\nUsage: tritonserver [options]", file=sys.stderr, flush=True)
        return 1
    try:
        if os.environ.get("KSERVE_STANDIN_REQUIRE_POD_FLAGS") == "1":
            check_pod_flags(given)
        models, executed = load_models(args.repositories, args.load_model, args.model_control_mode)
    except (OSError, ValueError) as exc:
        print(f"E tritonserver stand-in: {exc}", file=sys.stderr, flush=True)
        return 1
    load_seconds = float(os.environ.get("KSERVE_STANDIN_LOAD_SECONDS", "0"))
    bind_early = os.environ.get("KSERVE_STANDIN_BIND_EARLY") == "1"
    record = os.environ.get("KSERVE_STANDIN_RECORD")
    server = KServeStandIn(
        models,
        repository=executed,
        load_seconds=load_seconds if bind_early else 0.0,
        host=args.grpc_address,
        port=args.grpc_port,
        record_path=Path(record) if record else None,
    )
    http: ThreadingHTTPServer | None = None

    async def run() -> None:
        nonlocal http
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        shutdowns: list[asyncio.Future[None]] = []

        def on_signal() -> None:
            stopped.set()
            shutdowns.append(asyncio.ensure_future(server.shutdown(args.exit_timeout_secs)))

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        if not bind_early:
            # Triton loads its startup models inside TRITONSERVER_ServerNew and starts its
            # endpoints (gRPC, then HTTP) only after that returns.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), load_seconds)
            if stopped.is_set():
                return
        task = asyncio.ensure_future(server.serve())
        # HTTP (and its readiness answer) only once gRPC listens, as in Triton.
        while not server.serving and not task.done():
            await asyncio.sleep(0.01)
        if args.allow_http:
            handler = type("Handler", (_HttpHealth,), {"owner": server})
            http = ThreadingHTTPServer((args.http_address, args.http_port), handler)
            threading.Thread(target=http.serve_forever, daemon=True).start()
        print(
            f"I Started GRPCInferenceService at {server.url} (stand-in)",
            file=sys.stderr,
            flush=True,
        )
        await task

    asyncio.run(run())
    if http is not None:
        with contextlib.suppress(Exception):
            http.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
