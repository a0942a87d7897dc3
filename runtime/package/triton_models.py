"""The manifest's description of Triton models other than vLLM's: tensors, batching, instances,
the FIL backend's parameters and ensembles (the fields of Triton's ``model_config.proto``)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "MODEL_REPOSITORY",
    "DynamicBatching",
    "Ensemble",
    "EnsembleStep",
    "FilModelType",
    "FilParameters",
    "InstanceGroup",
    "ModelBackend",
    "TensorSpec",
    "TensorType",
    "TritonModel",
    "dims_agree",
    "refuse_optional_outputs",
]

MODEL_REPOSITORY = "model_repository"
"""Folder of a version (beside ``package.tar``) holding the Triton model repository that
``package build`` writes for non-LLM backends; tritonserver can be pointed at it as it is."""

_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
TensorType = Literal[
    "TYPE_BOOL",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_BF16",
    "TYPE_STRING",
]
ModelBackend = Literal["fil", "onnxruntime", "pytorch", "python"]
FilModelType = Literal["xgboost", "xgboost_json", "xgboost_ubj", "lightgbm"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """One input or output tensor of a model (Triton model config terms; no batch dimension)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    data_type: TensorType
    dims: list[int] = Field(min_length=1)
    optional: bool = False

    @field_validator("dims")
    @classmethod
    def _dims(cls, dims: list[int]) -> list[int]:
        if any(d == 0 or d < -1 for d in dims):
            raise ValueError(f"dims {dims} must be positive or -1 (variable)")
        return dims


def refuse_optional_outputs(outputs: list[TensorSpec], owner: str) -> list[TensorSpec]:
    """``outputs`` unless one is ``optional``: Triton's ``ModelOutput`` has no such field (only
    ``ModelInput`` has), so its config could not be written; ``owner`` names the model."""
    optional = [t.name for t in outputs if t.optional]
    if optional:
        tensors = (
            f"output {optional[0]}" if len(optional) == 1 else f"outputs {', '.join(optional)}"
        )
        verb = "is" if len(optional) == 1 else "are"
        raise ValueError(
            f"{owner}: {tensors} {verb} declared optional, but only inputs can be optional in "
            f"Triton; remove optional from {tensors}"
        )
    return outputs


class DynamicBatching(_Strict):
    """Triton's ``dynamic_batching``: requests queue up to form larger batches."""

    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preferred_batch_size: list[int] = Field(default_factory=list)

    @field_validator("preferred_batch_size")
    @classmethod
    def _sizes(cls, sizes: list[int]) -> list[int]:
        if any(size < 1 for size in sizes):
            raise ValueError(f"preferred_batch_size {sizes} must hold positive sizes")
        return sizes


class InstanceGroup(_Strict):
    """Where Triton runs the model's instances: ``KIND_CPU`` fits CPU node groups."""

    kind: Literal["KIND_CPU", "KIND_GPU", "KIND_AUTO"] = "KIND_CPU"
    count: int = Field(default=1, ge=1)


class FilParameters(_Strict):
    """The FIL backend's ``parameters`` (Triton 25.09 and later: ``is_classifier`` replaced
    ``output_class``), the model type and classifier kind as read from the model file."""

    model_type: FilModelType
    is_classifier: bool
    predict_proba: bool = Field(
        default=False, description="return one probability per class instead of the class"
    )
    threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="a binary classifier's decision threshold"
    )


class TritonModel(_Strict):
    """One model of the package's Triton model repository, with the tensors its file has."""

    name: str = Field(pattern=_NAME_PATTERN)
    backend: ModelBackend
    file: str = Field(description="the model file, relative to the version folder")
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    max_batch_size: int = Field(
        ge=0, description="0: no batching, dims are the full shapes; else the batch limit"
    )
    dynamic_batching: DynamicBatching | None = None
    instance_group: InstanceGroup = InstanceGroup()
    fil: FilParameters | None = None

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, outputs: list[TensorSpec], info: ValidationInfo) -> list[TensorSpec]:
        return refuse_optional_outputs(outputs, f"model {info.data.get('name', '?')}")

    @model_validator(mode="after")
    def _consistent(self) -> TritonModel:
        if (self.backend == "fil") != (self.fil is not None):
            raise ValueError(f"model {self.name}: fil parameters belong to backend fil only")
        if self.dynamic_batching is not None and self.max_batch_size == 0:
            raise ValueError(
                f"model {self.name}: dynamic_batching needs max_batch_size of at least 1"
            )
        batching = self.dynamic_batching
        sizes = batching.preferred_batch_size if batching is not None else []
        too_large = [size for size in sizes if size > self.max_batch_size]
        if too_large:
            # Triton refuses to load such a model ("dynamic batching preferred size must be <=
            # max batch size", ValidateModelConfig in core's model_config_utils.cc).
            raise ValueError(
                f"model {self.name}: dynamic_batching.preferred_batch_size "
                f"{', '.join(map(str, too_large))} is above max_batch_size "
                f"{self.max_batch_size}; lower it or raise max_batch_size"
            )
        names = [t.name for t in (*self.inputs, *self.outputs)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model {self.name}: tensor {', '.join(dupes)} is declared twice")
        return self

    @property
    def folder(self) -> str:
        """``model_repository/<name>``: the model's folder in the version folder."""
        return f"{MODEL_REPOSITORY}/{self.name}"


class EnsembleStep(_Strict):
    """One step: a model of the package, its tensors mapped to the ensemble's."""

    model: str = Field(pattern=_NAME_PATTERN)
    input_map: dict[str, str] = Field(description="model input name -> ensemble tensor name")
    output_map: dict[str, str] = Field(description="model output name -> ensemble tensor name")


class Ensemble(_Strict):
    """Triton's ensemble scheduler over the package's models; its tensors are derived from the
    steps (inputs: consumed and never produced)."""

    steps: list[EnsembleStep] = Field(min_length=1)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    max_batch_size: int = Field(ge=0)

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, outputs: list[TensorSpec]) -> list[TensorSpec]:
        return refuse_optional_outputs(outputs, "ensemble")


def dims_agree(a: list[int], b: list[int]) -> bool:
    """Whether tensors of dims ``a`` and ``b`` can be the same tensor (-1 matches any size)."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))
