"""The KServe tensors the OpenAI frontend's request builder sends and reads, and the check that a
``python`` backend model declares them compatibly (so a mismatch fails at packaging time)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.package.errors import PackageError
from runtime.package.manifest import PythonModel, TensorSpec

__all__ = ["FRONTEND_INPUTS", "FRONTEND_OUTPUTS", "FrontendTensor", "check_python_model"]


@dataclass(frozen=True)
class FrontendTensor:
    """One tensor of the frontend's request/response (the Triton vLLM backend's I/O)."""

    name: str
    data_type: str
    required: bool
    """Sent with every request, so a model may declare it non-optional."""
    generation: bool = True
    """Sent with generation requests, so a model must declare it (Triton rejects unknown
    inputs); ``False`` for inputs of other features (embeddings), declared only if served."""


# The vLLM backend's I/O, which the frontend's request builder (runtime/frontend) sends and
# reads: generation sends all but the last two inputs; scoring and embeddings send subsets.
FRONTEND_INPUTS = (
    FrontendTensor("text_input", "TYPE_STRING", required=True),
    FrontendTensor("stream", "TYPE_BOOL", required=False),
    FrontendTensor("sampling_parameters", "TYPE_STRING", required=False),
    FrontendTensor("exclude_input_in_output", "TYPE_BOOL", required=False),
    FrontendTensor("return_finish_reason", "TYPE_BOOL", required=False),
    FrontendTensor("return_logprobs", "TYPE_BOOL", required=False),
    FrontendTensor("return_num_input_tokens", "TYPE_BOOL", required=False),
    FrontendTensor("return_num_output_tokens", "TYPE_BOOL", required=False),
    FrontendTensor("return_cumulative_logprob", "TYPE_BOOL", required=False, generation=False),
    FrontendTensor("embedding_request", "TYPE_STRING", required=False, generation=False),
)
FRONTEND_OUTPUTS = (
    FrontendTensor("text_output", "TYPE_STRING", required=True),
    FrontendTensor("finish_reason", "TYPE_STRING", required=False),
    FrontendTensor("cumulative_logprob", "TYPE_FP32", required=False),
    FrontendTensor("logprobs", "TYPE_STRING", required=False),
    FrontendTensor("num_input_tokens", "TYPE_UINT32", required=False),
    FrontendTensor("num_output_tokens", "TYPE_UINT32", required=False),
)


def check_python_model(model: PythonModel) -> None:
    """Raise `PackageError` listing every way the model's tensors disagree with the frontend."""
    problems: list[str] = []
    problems += _compare("input", model.inputs, FRONTEND_INPUTS, sends=True)
    problems += _compare("output", model.outputs, FRONTEND_OUTPUTS, sends=False)
    if problems:
        raise PackageError("python_model tensors do not match the frontend: " + "; ".join(problems))


def _compare(
    kind: str, declared: list[TensorSpec], frontend: tuple[FrontendTensor, ...], *, sends: bool
) -> list[str]:
    problems = []
    by_name: dict[str, TensorSpec] = {}
    for tensor in declared:
        if tensor.name in by_name:
            problems.append(f"{kind} {tensor.name} is declared twice")
        by_name[tensor.name] = tensor
    for expected in frontend:
        tensor = by_name.get(expected.name)
        if tensor is None:
            if expected.required:
                problems.append(f"{kind} {expected.name} ({expected.data_type}) is missing")
            elif sends and expected.generation:
                problems.append(
                    f"input {expected.name} ({expected.data_type}, optional) is missing: "
                    "the frontend may send it and Triton rejects undeclared inputs"
                )
            continue
        if tensor.data_type != expected.data_type:
            problems.append(
                f"{kind} {tensor.name} is {tensor.data_type}, "
                f"the frontend uses {expected.data_type}"
            )
        if sends and expected.required and tensor.optional:
            problems.append(
                f"input {tensor.name} must not be optional: the frontend always sends it"
            )
        if sends and not expected.required and not tensor.optional:
            problems.append(
                f"input {tensor.name} must be optional: the frontend does not always send it"
            )
    known = {t.name for t in frontend}
    for name, tensor in by_name.items():
        if sends and name not in known and not tensor.optional:
            problems.append(f"input {name} is required but the frontend never sends it")
    return problems
