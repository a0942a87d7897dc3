"""The engine over KServe v2 gRPC (``tritonclient.grpc``), Triton's vLLM backend behind it.

Health and metadata go through ``tritonclient.grpc.aio``. Inference takes a leaner path on the
same service definitions (``tritonclient.grpc.service_pb2``): each request is one
``ModelStreamInfer`` call that sends its one request and half-closes in a single batch of
gRPC operations, then reads responses with ``read()``. On the wire this is exactly what
``stream_infer`` sends for one request; it saves the request-iterator task, a write and a
half-close operation per request and an async-iterator layer per token, which the streamed
throughput on a busy CPU pays for.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, cast

import grpc
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import (
    MAX_GRPC_MESSAGE_SIZE,
    InferResult,
    KeepAliveOptions,
    service_pb2,
)
from tritonclient.utils import InferenceServerException

from runtime.frontend.engine import (
    ChoiceOutput,
    Engine,
    EngineOutput,
    GenerateParams,
    ScoredCandidate,
    TokenLogprob,
)
from runtime.frontend.errors import (
    BackendError,
    BackendUnavailableError,
    EngineFailedError,
    FieldRefusedError,
    FrontendError,
    InvalidRequestError,
    NotSupportedError,
)
from runtime.frontend.tensors import INPUT_SHAPE, input_tensor
from runtime.serving_backend import (
    CACHE_SALT_PARAMETER,
    CACHED_TOKENS_OUTPUT,
    INVALID_PARAMETERS,
    PROMPT_LOGPROBS_OUTPUT,
    STOP_REASON_OUTPUT,
)

__all__ = ["PROMPT_LOGPROBS_OUTPUT", "KServeEngine", "prompt_token_logprobs"]

_NOT_FINISHED = "None"
#: Sampling fields the stock backend cannot honour (field, what it does, what ours does).
_STOCK_BACKEND_FIELDS = (
    (
        "logit_bias",
        "hands vLLM logit_bias keys as JSON strings that vLLM refuses",
        "passes them as token ids",
    ),
    (
        "stream_interval",
        "streams every token on its own whatever stream_interval says",
        "honours it",
    ),
    (
        "prompt_logprobs",
        "returns no prompt log-probabilities",
        "does",
    ),
)
#: What a generation that echoes its prompt with log-probabilities asks for.
_ECHO_OUTPUTS = (
    "text_output",
    "finish_reason",
    "num_input_tokens",
    "num_output_tokens",
    "logprobs",
    PROMPT_LOGPROBS_OUTPUT,
)
#: The llm_serving_vllm backend's outputs that a generation reads where the model declares them
#: (an older backend may not).
_OUR_OUTPUTS = (CACHED_TOKENS_OUTPUT, STOP_REASON_OUTPUT)
_STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def _channel_options() -> list[tuple[str, Any]]:
    """tritonclient's own defaults (message size, keep-alive), for both channels."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
    ]


def _request(
    model: str,
    request_id: str,
    values: Mapping[str, Any],
    outputs: tuple[str, ...] = (),
    parameters: Mapping[str, str] | None = None,
) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` with every input as raw contents, as tritonclient encodes them,
    and ``parameters`` as the request's string parameters.

    The wire type comes from the tensor table, so every tensor sent here is declared there
    (the table ``llm-serving package verify`` checks python backend models against).
    """
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for key, text in (parameters or {}).items():
        request.parameters[key].string_param = text
    for name, value in values.items():
        wire_type = input_tensor(name).wire_type
        request.inputs.add(name=name, datatype=wire_type, shape=INPUT_SHAPE)
        if wire_type == "BOOL":
            raw = b"\x01" if value else b"\x00"
        else:
            data = value.encode("utf-8") if isinstance(value, str) else value
            raw = _LENGTH.pack(len(data)) + data
        request.raw_input_contents.append(raw)
    for name in outputs:
        request.outputs.add(name=name)
    return request


def _stop_reason(encoded: str) -> str | int | None:
    """vLLM's ``stop_reason`` from the backend's JSON of it (``None`` for anything else)."""
    try:
        value = json.loads(encoded)
    except ValueError:
        return None
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def _outputs(response: service_pb2.ModelInferResponse) -> dict[str, list[Any]]:
    """Decode every output of a response straight from its raw contents (one pass, no numpy).

    Triton sends outputs as ``raw_output_contents``: BYTES elements are a 4-byte little-endian
    length then the bytes; numbers are little-endian arrays.
    """
    if len(response.raw_output_contents) != len(response.outputs):
        result = InferResult(response)
        return {
            o.name: [
                v.decode() if isinstance(v, bytes) else v
                for v in result.as_numpy(o.name).reshape(-1).tolist()
            ]
            for o in response.outputs
        }
    out: dict[str, list[Any]] = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        kind = tensor.datatype
        if kind == "BYTES":
            if len(raw) == 4 + int.from_bytes(raw[:4], "little"):
                # One element, what every generation output is: skip the general loop.
                out[tensor.name] = [raw[4:].decode("utf-8")]
                continue
            values, offset = [], 0
            while offset < len(raw):
                (size,) = _LENGTH.unpack_from(raw, offset)
                offset += 4
                values.append(raw[offset : offset + size].decode("utf-8"))
                offset += size
            out[tensor.name] = values
        elif kind in _NUMBER_CODES:
            code = _NUMBER_CODES[kind]
            out[tensor.name] = list(struct.unpack(f"<{len(raw) // 4}{code}", raw))
    return out


_LENGTH = struct.Struct("<I")
_NUMBER_CODES = {"UINT32": "I", "INT32": "i", "FP32": "f"}


#: How the vLLM backend (stock and ours) refuses a request of a task its engine does not run.
_UNSUPPORTED_TASK = re.compile(r"does not support '(generate|embed)' request")
_TASK_ROUTES = {
    "embed": ("/v1/embeddings", "only a pooling model (engine_args runner: pooling) does"),
    "generate": ("chat and text completions", "this one is a pooling model"),
}


#: vLLM's ``FinishReason.ERROR``: a grammar that failed to compile (which vLLM learns only after
#: the request is accepted) or that rejected a sampled token. vLLM's server answers it with a 500.
_ENGINE_ERROR = "error"


def _backend_error(message: str) -> FrontendError:
    """A request the llm_serving_vllm backend says vLLM refused as given (a structured output
    that its grammar engine cannot compile, say) is the client's to change: a 400, which the
    openai client does not retry; a route the model's task cannot answer is a 501; anything
    else Triton answers is a 502."""
    if f"{INVALID_PARAMETERS}: " in message:
        return InvalidRequestError(
            f"the engine refused the request: {message}", code="engine_refused"
        )
    if match := _UNSUPPORTED_TASK.search(message):
        route, who = _TASK_ROUTES[match[1]]
        return NotSupportedError(
            f"this model does not serve {route}: {who} (Triton: {message})",
            param="model",
            code="model_not_supported",
        )
    return BackendError(f"Triton: {message}")


def _logprobs(raw: str | None) -> tuple[TokenLogprob, ...]:
    """Parse the backend's ``logprobs`` JSON: per token, sampled token first, then the top-k."""
    if raw is None or raw == "null":
        return ()
    return tuple(_step(step) for step in json.loads(raw) if step)


def _prompt_logprobs(raw: str) -> tuple[TokenLogprob | None, ...]:
    """Parse the ``prompt_logprobs`` output: per prompt position, the prompt's own token first,
    then the top-k, or ``null`` where there is none (the first position)."""
    return tuple(_step(step) if step else None for step in json.loads(raw))


def _step(step: dict[str, Any]) -> TokenLogprob:
    """One position's ``{token_id: {"logprob", "rank", "decoded_token"}}``, the token that is
    there first, as vLLM's ``Logprob`` dicts are ordered."""
    there = _entry(*next(iter(step.items())))
    ranked = sorted(step.items(), key=lambda item: item[1].get("rank", 0))
    return replace(there, top=tuple(_entry(key, entry) for key, entry in ranked))


def _entry(key: str, entry: dict[str, Any]) -> TokenLogprob:
    """One ``{token_id: {"logprob", "rank", "decoded_token"}}`` item (vLLM's ``Logprob``)."""
    token_id = int(key) if key.isdigit() else None
    rank = entry.get("rank")
    return TokenLogprob(
        entry.get("decoded_token") or "",
        float(entry["logprob"]),
        (),
        token_id,
        rank if isinstance(rank, int) else None,
    )


def prompt_token_logprobs(text: str) -> list[float]:
    """Each prompt token's log-probability from the ``prompt_logprobs`` output's JSON (one entry
    per position, ``null`` or ``{token_id: {"logprob", ...}}``; 0.0 where there is none).

    The frontend asks for ``prompt_logprobs: 0``, so each position holds just the prompt
    token's own entry.
    """
    return [float(next(iter(r.values()))["logprob"]) if r else 0.0 for r in json.loads(text)]


class KServeEngine(Engine):
    """Sends each request on its own ``ModelStreamInfer`` stream; cancelling it aborts vLLM's."""

    def __init__(self, url: str, model_name: str) -> None:
        self.url = url
        self.model_name = model_name
        self._client: grpcclient.InferenceServerClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._infer: grpc.aio.UnaryStreamMultiCallable | None = None
        self._outputs: set[str] | None = None

    async def start(self) -> None:
        options = _channel_options()
        self._client = grpcclient.InferenceServerClient(self.url, channel_args=options)
        self._channel = grpc.aio.insecure_channel(self.url, options=options)
        self._infer = self._channel.unary_stream(
            _STREAM_METHOD,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._channel is not None:
            await self._channel.close()

    @property
    def client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:
            raise BackendUnavailableError("the engine is not started")
        return self._client

    async def ready(self) -> bool:
        try:
            return bool(
                await self.client.is_server_ready()
                and await self.client.is_model_ready(self.model_name)
            )
        except InferenceServerException:
            return False

    async def _declared_outputs(self) -> set[str]:
        if self._outputs is None:
            try:
                meta = await self.client.get_model_metadata(self.model_name, as_json=True)
            except InferenceServerException as exc:
                raise BackendUnavailableError(f"Triton model metadata: {exc.message()}") from None
            self._outputs = {o["name"] for o in meta.get("outputs", [])}
        return self._outputs

    async def _stream(
        self,
        values: Mapping[str, Any],
        request_id: str,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str] | None = None,
    ) -> AsyncIterator[service_pb2.ModelInferResponse]:
        if self._infer is None:
            raise BackendUnavailableError("the engine is not started")
        call = self._infer(_request(self.model_name, request_id, values, outputs, parameters))
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return
                if message.error_message:
                    raise _backend_error(message.error_message)
                yield message.infer_response
        except grpc.aio.AioRpcError as exc:
            raise BackendUnavailableError(
                f"Triton unreachable: {exc.code().name}: {exc.details()}"
            ) from None
        finally:
            # Closing the stream (client gone, deadline, error) cancels the Triton request.
            call.cancel()

    async def _extended(self) -> bool:
        """Whether the model runs this project's backend, ``llm_serving_vllm`` (it alone
        declares the ``prompt_logprobs`` output), rather than NVIDIA's stock one."""
        return PROMPT_LOGPROBS_OUTPUT in await self._declared_outputs()

    async def returns_prompt_logprobs(self) -> str | None:
        if await self._extended():
            return None
        return (
            f"model '{self.model_name}' runs the stock Triton vLLM backend, which returns no "
            "prompt log-probabilities; the serving image's llm_serving_vllm backend does"
        )

    async def generate(self, params: GenerateParams) -> AsyncGenerator[EngineOutput, None]:
        for field, stock, ours in _STOCK_BACKEND_FIELDS:
            if field in params.sampling and not await self._extended():
                raise FieldRefusedError(
                    field,
                    f"model '{self.model_name}' runs the stock Triton vLLM backend, which {stock}; "
                    f"the serving image's llm_serving_vllm backend {ours}",
                )
        parameters = None
        if params.cache_salt is not None:
            if CACHED_TOKENS_OUTPUT not in await self._declared_outputs():
                raise FieldRefusedError(
                    "cache_salt",
                    f"model '{self.model_name}' runs a Triton vLLM backend that would drop it "
                    "(the stock one, or an llm_serving_vllm older than cache_salt); the serving "
                    "image's llm_serving_vllm backend gives it to vLLM",
                )
            parameters = {CACHE_SALT_PARAMETER: params.cache_salt}
        values = {
            "text_input": params.prompt,
            "stream": params.stream,
            "sampling_parameters": json.dumps(params.sampling),
            "exclude_input_in_output": True,
            "return_finish_reason": True,
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
            "return_logprobs": params.logprobs,
        }
        # The stand-ins and Triton alike return prompt_logprobs only when it is asked for.
        wanted: tuple[str, ...] = ()
        if "prompt_logprobs" in params.sampling:
            declared = await self._declared_outputs()
            wanted = _ECHO_OUTPUTS + tuple(o for o in _OUR_OUTPUTS if o in declared)
        async for response in self._stream(values, params.request_id, wanted, parameters):
            outputs = _outputs(response)
            texts = outputs.get("text_output", [])
            reasons = outputs.get("finish_reason") or [_NOT_FINISHED] * len(texts)
            if _ENGINE_ERROR in reasons:
                raise EngineFailedError(
                    "the engine ended the request with finish_reason 'error': vLLM could not "
                    "compile its structured-output grammar, or the grammar rejected a token "
                    "(the engine's log says which)",
                    code="engine_error",
                )
            counts = outputs.get("num_output_tokens")
            stops = outputs.get(STOP_REASON_OUTPUT)
            logprobs = outputs.get("logprobs") if params.logprobs else None
            prompt_tokens = outputs.get("num_input_tokens")
            choices = tuple(
                ChoiceOutput(
                    index=i,
                    text=text,
                    finish_reason=None if reasons[i] == _NOT_FINISHED else reasons[i],
                    num_tokens=counts[i] if counts else 0,
                    logprobs=_logprobs(logprobs[i]) if logprobs else (),
                    stop_reason=_stop_reason(stops[i]) if stops and i < len(stops) else None,
                )
                for i, text in enumerate(texts)
            )
            finished = all(c.finish_reason is not None for c in choices)
            prompt_logprobs = outputs.get(PROMPT_LOGPROBS_OUTPUT)
            cached = outputs.get(CACHED_TOKENS_OUTPUT)
            yield EngineOutput(
                choices=choices,
                prompt_tokens=prompt_tokens[0] if prompt_tokens else None,
                finished=finished,
                prompt_logprobs=_prompt_logprobs(prompt_logprobs[0]) if prompt_logprobs else None,
                cached_tokens=cached[0] if cached else None,
            )
            if finished:
                return

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        request: dict[str, Any] = {"input": text}
        if dimensions is not None:
            request["pooling_params"] = {"dimensions": [dimensions]}
        values = {
            "text_input": text,
            "embedding_request": json.dumps(request),
            "return_num_input_tokens": True,
        }
        async for response in self._stream(values, ""):
            outputs = _outputs(response)
            vector = json.loads(outputs.get("text_output", ["[]"])[0])
            return [float(v) for v in vector], outputs.get("num_input_tokens", [0])[0]
        raise BackendError("Triton returned no embedding")

    async def score(self, prompt: str, candidates: list[str]) -> list[ScoredCandidate]:
        reason = await self.returns_prompt_logprobs()
        if reason is not None:
            raise NotSupportedError(
                f"{reason}, so it cannot be scored without decoding", code="scoring_unsupported"
            )
        prefill = {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}

        async def prompt_len() -> int:
            values = {
                "text_input": prompt,
                "sampling_parameters": json.dumps({"max_tokens": 1}),
                "exclude_input_in_output": True,
                "return_num_input_tokens": True,
            }
            async for response in self._stream(values, "", ("text_output", "num_input_tokens")):
                return _outputs(response)["num_input_tokens"][0]
            raise BackendError("Triton returned no token count")

        async def one(candidate: str) -> list[float]:
            values = {
                "text_input": prompt + candidate,
                "sampling_parameters": json.dumps(prefill),
                "exclude_input_in_output": True,
            }
            wanted = ("text_output", PROMPT_LOGPROBS_OUTPUT)
            async for response in self._stream(values, "", wanted):
                return prompt_token_logprobs(
                    _outputs(response).get(PROMPT_LOGPROBS_OUTPUT, ["[]"])[0]
                )
            raise BackendError("Triton returned no prompt log-probabilities")

        # All prefills go out together so vLLM batches them (and shares the prompt's prefix).
        results = await asyncio.gather(prompt_len(), *(one(c) for c in candidates))
        start = cast(int, results[0])
        rows = cast(list[list[float]], results[1:])
        return [
            ScoredCandidate(
                logprob=sum(r[start:]), num_tokens=len(r) - start, token_logprobs=tuple(r[start:])
            )
            for r in rows
        ]
