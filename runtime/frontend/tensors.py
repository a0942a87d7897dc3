"""The KServe tensors the request builder (`runtime.frontend.kserve_engine`) sends and reads.

The builder takes every tensor's wire type from this table, so a tensor it sends is in the
table by construction; ``llm-serving package verify`` checks ``python`` backend models against
the same table, so a model that would reject the frontend's requests fails at packaging time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FRONTEND_INPUTS", "FRONTEND_OUTPUTS", "INPUT_SHAPE", "FrontendTensor", "input_tensor"]

#: The shape the builder gives every input: one element (a string, a flag, a JSON document).
INPUT_SHAPE: tuple[int, ...] = (1,)

# Triton model-config data types -> KServe v2 wire data types.
_WIRE_TYPES = {
    "TYPE_STRING": "BYTES",
    "TYPE_BOOL": "BOOL",
    "TYPE_FP32": "FP32",
    "TYPE_UINT32": "UINT32",
}


@dataclass(frozen=True)
class FrontendTensor:
    """One tensor of the frontend's request or response (the Triton vLLM backend's I/O)."""

    name: str
    data_type: str
    """Triton model-config data type (``TYPE_STRING``, ...)."""
    required: bool
    """Sent with every request, so a model may declare it non-optional."""
    generation: bool = True
    """Sent with generation requests, so a model must declare it (Triton rejects unknown
    inputs); ``False`` for inputs of other features (embeddings), declared only if served."""

    @property
    def wire_type(self) -> str:
        """The KServe v2 data type on the wire (``BYTES``, ``BOOL``, ...)."""
        return _WIRE_TYPES[self.data_type]


FRONTEND_INPUTS = (
    FrontendTensor("text_input", "TYPE_STRING", required=True),
    FrontendTensor("stream", "TYPE_BOOL", required=False),
    FrontendTensor("sampling_parameters", "TYPE_STRING", required=False),
    FrontendTensor("exclude_input_in_output", "TYPE_BOOL", required=False),
    FrontendTensor("return_finish_reason", "TYPE_BOOL", required=False),
    FrontendTensor("return_logprobs", "TYPE_BOOL", required=False),
    FrontendTensor("return_num_input_tokens", "TYPE_BOOL", required=False),
    FrontendTensor("return_num_output_tokens", "TYPE_BOOL", required=False),
    FrontendTensor("embedding_request", "TYPE_STRING", required=False, generation=False),
)
FRONTEND_OUTPUTS = (
    FrontendTensor("text_output", "TYPE_STRING", required=True),
    FrontendTensor("finish_reason", "TYPE_STRING", required=False),
    FrontendTensor("logprobs", "TYPE_STRING", required=False),
    FrontendTensor("num_input_tokens", "TYPE_UINT32", required=False),
    FrontendTensor("num_output_tokens", "TYPE_UINT32", required=False),
    # Only backends that return vLLM's prompt log-probabilities declare it (scoring).
    FrontendTensor("prompt_logprobs", "TYPE_STRING", required=False),
    # The llm_serving_vllm backend's count of prompt tokens the prefix cache served.
    FrontendTensor("num_cached_tokens", "TYPE_UINT32", required=False),
)
_INPUTS = {t.name: t for t in FRONTEND_INPUTS}


def input_tensor(name: str) -> FrontendTensor:
    """The table's entry for an input the builder sends (``KeyError`` for one not in it)."""
    return _INPUTS[name]
