"""The engine over KServe v2 gRPC (``tritonclient.grpc.aio``), Triton's vLLM backend behind it."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from runtime.frontend.engine import (
    ChoiceOutput,
    Engine,
    EngineOutput,
    GenerateParams,
    ScoredCandidate,
    TokenLogprob,
)
from runtime.frontend.errors import BackendError, BackendUnavailableError, NotSupportedError
from runtime.frontend.tensors import input_tensor

__all__ = ["PROMPT_LOGPROBS_OUTPUT", "KServeEngine"]

#: Output a backend declares when it returns vLLM's prompt log-probabilities (the stock vLLM
#: backend does not; scoring is refused with 501 against it).
PROMPT_LOGPROBS_OUTPUT = "prompt_logprobs"
_NOT_FINISHED = "None"


def _tensor(name: str, value: Any) -> grpcclient.InferInput:
    # The wire type comes from the tensor table, so every tensor sent here is declared there
    # (the table `llm-serving package verify` checks python backend models against).
    wire_type = input_tensor(name).wire_type
    tensor = grpcclient.InferInput(name, [1], wire_type)
    if wire_type == "BOOL":
        tensor.set_data_from_numpy(np.array([bool(value)], dtype=np.bool_))
    else:
        data = value.encode("utf-8") if isinstance(value, str) else value
        tensor.set_data_from_numpy(np.array([data], dtype=np.object_))
    return tensor


def _outputs(result: Any) -> dict[str, list[Any]]:
    """Decode every output of a response straight from its raw contents (one pass, no numpy).

    Triton sends outputs as ``raw_output_contents``: BYTES elements are a 4-byte little-endian
    length then the bytes; numbers are little-endian arrays.
    """
    response = result.get_response()
    if len(response.raw_output_contents) != len(response.outputs):
        return {
            o.name: [
                v.decode() if isinstance(v, bytes) else v
                for v in result.as_numpy(o.name).reshape(-1).tolist()
            ]
            for o in response.outputs
        }
    out: dict[str, list[Any]] = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        if tensor.datatype == "BYTES":
            values, offset = [], 0
            while offset < len(raw):
                (size,) = _LENGTH.unpack_from(raw, offset)
                offset += 4
                values.append(raw[offset : offset + size].decode("utf-8"))
                offset += size
        else:
            code = _NUMBER_CODES.get(tensor.datatype)
            if code is None:
                continue
            values = list(struct.unpack(f"<{len(raw) // 4}{code}", raw))
        out[tensor.name] = values
    return out


_LENGTH = struct.Struct("<I")
_NUMBER_CODES = {"UINT32": "I", "INT32": "i", "FP32": "f"}


def _logprobs(raw: str | None) -> tuple[TokenLogprob, ...]:
    """Parse the backend's ``logprobs`` JSON: per token, sampled token first, then the top-k."""
    if raw is None or raw == "null":
        return ()
    steps = json.loads(raw)
    out = []
    for step in steps:
        entries = list(step.values())
        if not entries:
            continue
        sampled = entries[0]
        top = sorted(entries, key=lambda e: e.get("rank", 0))
        out.append(
            TokenLogprob(
                token=sampled.get("decoded_token") or "",
                logprob=float(sampled["logprob"]),
                top=tuple((e.get("decoded_token") or "", float(e["logprob"])) for e in top),
            )
        )
    return tuple(out)


class KServeEngine(Engine):
    """Sends each request on its own ``ModelStreamInfer`` stream; cancelling it aborts vLLM's."""

    def __init__(self, url: str, model_name: str) -> None:
        self.url = url
        self.model_name = model_name
        self._client: grpcclient.InferenceServerClient | None = None
        self._outputs: set[str] | None = None

    async def start(self) -> None:
        self._client = grpcclient.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

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
        self, inputs: list[grpcclient.InferInput], request_id: str, outputs: list[str] | None = None
    ) -> AsyncIterator[Any]:
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": self.model_name,
                "inputs": inputs,
                "outputs": requested,
                "request_id": request_id,
            }

        try:
            call = self.client.stream_infer(one())
        except InferenceServerException as exc:
            raise BackendUnavailableError(f"Triton: {exc.message()}") from None
        try:
            async for result, error in call:
                if error is not None:
                    raise BackendError(f"Triton: {error.message()}")
                yield result
        except InferenceServerException as exc:
            raise BackendUnavailableError(f"Triton: {exc.message()}") from None
        except grpc.RpcError as exc:
            # The stream iterator surfaces transport failures as grpc.aio.AioRpcError.
            raise BackendUnavailableError(f"Triton unreachable: {exc}") from None
        finally:
            # Closing the stream (client gone, deadline, error) cancels the Triton request.
            call.cancel()

    async def generate(self, params: GenerateParams) -> AsyncIterator[EngineOutput]:
        inputs = [
            _tensor("text_input", params.prompt),
            _tensor("stream", params.stream),
            _tensor("sampling_parameters", json.dumps(params.sampling)),
            _tensor("exclude_input_in_output", True),
            _tensor("return_finish_reason", True),
            _tensor("return_num_input_tokens", True),
            _tensor("return_num_output_tokens", True),
            _tensor("return_logprobs", params.logprobs),
        ]
        async for result in self._stream(inputs, params.request_id):
            outputs = _outputs(result)
            texts = outputs.get("text_output", [])
            reasons = outputs.get("finish_reason") or [_NOT_FINISHED] * len(texts)
            counts = outputs.get("num_output_tokens")
            logprobs = outputs.get("logprobs") if params.logprobs else None
            prompt_tokens = outputs.get("num_input_tokens")
            choices = tuple(
                ChoiceOutput(
                    index=i,
                    text=text,
                    finish_reason=None if reasons[i] == _NOT_FINISHED else reasons[i],
                    num_tokens=counts[i] if counts else 0,
                    logprobs=_logprobs(logprobs[i]) if logprobs else (),
                )
                for i, text in enumerate(texts)
            )
            finished = all(c.finish_reason is not None for c in choices)
            yield EngineOutput(
                choices=choices,
                prompt_tokens=prompt_tokens[0] if prompt_tokens else None,
                finished=finished,
            )
            if finished:
                return

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        request: dict[str, Any] = {"input": text}
        if dimensions is not None:
            request["pooling_params"] = {"dimensions": [dimensions]}
        inputs = [
            _tensor("text_input", text),
            _tensor("embedding_request", json.dumps(request)),
            _tensor("return_num_input_tokens", True),
        ]
        async for result in self._stream(inputs, ""):
            outputs = _outputs(result)
            vector = json.loads(outputs.get("text_output", ["[]"])[0])
            return [float(v) for v in vector], outputs.get("num_input_tokens", [0])[0]
        raise BackendError("Triton returned no embedding")

    async def score(self, prompt: str, candidates: list[str]) -> list[ScoredCandidate]:
        if PROMPT_LOGPROBS_OUTPUT not in await self._declared_outputs():
            raise NotSupportedError(
                f"model '{self.model_name}' declares no '{PROMPT_LOGPROBS_OUTPUT}' output: the "
                "stock Triton vLLM backend does not return prompt log-probabilities, so scoring "
                "without decoding is impossible against it",
                code="scoring_unsupported",
            )
        prefill = {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}

        async def prompt_len() -> int:
            inputs = [
                _tensor("text_input", prompt),
                _tensor("sampling_parameters", json.dumps({"max_tokens": 1})),
                _tensor("exclude_input_in_output", True),
                _tensor("return_num_input_tokens", True),
            ]
            async for result in self._stream(inputs, "", ["text_output", "num_input_tokens"]):
                return _outputs(result)["num_input_tokens"][0]
            raise BackendError("Triton returned no token count")

        async def one(candidate: str) -> list[float]:
            inputs = [
                _tensor("text_input", prompt + candidate),
                _tensor("sampling_parameters", json.dumps(prefill)),
                _tensor("exclude_input_in_output", True),
            ]
            async for result in self._stream(inputs, "", ["text_output", PROMPT_LOGPROBS_OUTPUT]):
                rows = json.loads(_outputs(result).get(PROMPT_LOGPROBS_OUTPUT, ["[]"])[0])
                # With prompt_logprobs=0 each position holds just the prompt token's entry.
                return [float(next(iter(r.values()))["logprob"]) if r else 0.0 for r in rows]
            raise BackendError("Triton returned no prompt log-probabilities")

        # All prefills go out together so vLLM batches them (and shares the prompt's prefix).
        start, *rows = await asyncio.gather(prompt_len(), *(one(c) for c in candidates))
        return [
            ScoredCandidate(
                logprob=sum(r[start:]), num_tokens=len(r) - start, token_logprobs=tuple(r[start:])
            )
            for r in rows
        ]
