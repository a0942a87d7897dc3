"""The check that a ``python`` backend model declares the tensors the OpenAI frontend's request
builder sends and reads (`runtime.frontend.tensors`), so a mismatch fails at packaging time."""

from __future__ import annotations

from runtime.frontend.tensors import FRONTEND_INPUTS, FRONTEND_OUTPUTS, INPUT_SHAPE, FrontendTensor
from runtime.package.errors import PackageError
from runtime.package.manifest import PythonModel, TensorSpec

__all__ = ["check_python_model"]

# The entrypoint renders python models with ``max_batch_size: 0`` (the manifest has no batching
# setting), so Triton matches the request builder's INPUT_SHAPE against the declared dims as
# they are, with no batch dimension in front: same rank, and each dim equal or -1.


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
    for spec in declared:
        if spec.name in by_name:
            problems.append(f"{kind} {spec.name} is declared twice")
        by_name[spec.name] = spec
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
        if sends and not _accepts(tensor.dims, INPUT_SHAPE):
            problems.append(
                f"input {tensor.name} declares dims {tensor.dims} but the frontend sends shape "
                f"{list(INPUT_SHAPE)} (max_batch_size 0): declare dims {list(INPUT_SHAPE)} or [-1]"
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


def _accepts(dims: list[int], shape: tuple[int, ...]) -> bool:
    """Whether Triton takes a ``shape`` request tensor for an input declaring ``dims``."""
    return len(dims) == len(shape) and all(d in (-1, n) for d, n in zip(dims, shape, strict=True))
