"""The frontend's real KServe client, recording each request it sends to real Triton.

Tests that run the frontend against real Triton (``tests/support/real_triton.py``) still check
what the frontend put on the wire: the tensors of every ``ModelStreamInfer`` request, recorded
as the KServe stand-in records what it receives (:class:`RecordedRequest`), then sent unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from tritonclient.grpc import service_pb2

from runtime.frontend.kserve_engine import KServeEngine
from runtime.frontend.tensors import input_tensor
from tests.support.kserve_server import RecordedRequest

__all__ = ["RecordingKServeEngine"]


class RecordingKServeEngine(KServeEngine):
    """``KServeEngine`` that appends a :class:`RecordedRequest` to ``requests`` per request."""

    def __init__(self, url: str, model_name: str) -> None:
        super().__init__(url, model_name)
        self.requests: list[RecordedRequest] = []

    def _stream(
        self,
        values: Mapping[str, Any],
        request_id: str,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str] | None = None,
    ) -> AsyncIterator[service_pb2.ModelInferResponse]:
        self.requests.append(_recorded(self.model_name, values, outputs, request_id, parameters))
        return super()._stream(values, request_id, outputs, parameters)


def _recorded(
    model: str,
    values: Mapping[str, Any],
    outputs: tuple[str, ...],
    request_id: str,
    parameters: Mapping[str, str] | None,
) -> RecordedRequest:
    flags = {
        name: bool(value)
        for name, value in values.items()
        if input_tensor(name).wire_type == "BOOL"
    }
    embedding = values.get("embedding_request")
    return RecordedRequest(
        model=model,
        rpc="ModelStreamInfer",
        text_input=values.get("text_input"),
        flags=flags,
        sampling_parameters=json.loads(values.get("sampling_parameters") or "{}"),
        requested_outputs=outputs,
        embedding_request=json.loads(embedding) if embedding is not None else None,
        request_id=request_id,
        parameters=dict(parameters or {}),
    )
