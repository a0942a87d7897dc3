"""The Triton model repository of a non-LLM package (``fil``, ``onnxruntime``, ``pytorch``,
``ensemble``): what ``package.yaml`` says of its models, their tensors read from the model
files, the ensemble's tensor flow, and the files ``package build`` places under
``model_repository/``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.package.ensembles import check_ensemble, check_steps
from runtime.package.errors import PackageError, field_error
from runtime.package.model_config import ensemble_config, model_config
from runtime.package.model_files import (
    check_torchscript,
    fil_model_type,
    model_file_name,
    read_fil,
    read_onnx,
)
from runtime.package.sources import SourceFile, collect, resolve_inside
from runtime.package.triton_models import (
    MODEL_REPOSITORY,
    DynamicBatching,
    Ensemble,
    EnsembleStep,
    FilModelType,
    InstanceGroup,
    ModelBackend,
    TensorSpec,
    TritonModel,
)

__all__ = [
    "EnsembleSpec",
    "FilOptions",
    "ModelSpec",
    "check_model_file",
    "repository_configs",
    "resolve_ensemble",
    "resolve_model",
]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FilOptions(_Spec):
    """What ``package.yaml`` may set of the FIL backend; the rest is read from the model file."""

    model_type: FilModelType | None = Field(
        default=None, description="default: from the file suffix (.json, .ubj, .model, .txt)"
    )
    predict_proba: bool = False
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)


class ModelSpec(_Spec):
    """One model in ``package.yaml``: its file in the source tree and how Triton batches and
    places it. Tensors are read from the file, except TorchScript's and Python's (declared)."""

    name: str | None = Field(default=None, description="ensemble members only")
    backend: ModelBackend | None = Field(default=None, description="ensemble members only")
    file: str = Field(description="model file in the source tree (python: its model.py)")
    max_batch_size: int = Field(default=0, ge=0)
    dynamic_batching: DynamicBatching | None = None
    instance_group: InstanceGroup = InstanceGroup()
    inputs: list[TensorSpec] | None = Field(default=None, description="pytorch and python only")
    outputs: list[TensorSpec] | None = Field(default=None, description="pytorch and python only")
    fil: FilOptions | None = None


class EnsembleSpec(_Spec):
    """An ``ensemble`` package: its models and the steps chaining them."""

    models: list[ModelSpec] = Field(min_length=1)
    steps: list[EnsembleStep] = Field(min_length=1)
    outputs: list[str] = Field(min_length=1, description="ensemble tensors the caller gets")
    max_batch_size: int = Field(default=0, ge=0)


def resolve_model(
    source: Path, spec: ModelSpec, name: str, backend: ModelBackend, where: str
) -> tuple[TritonModel, list[SourceFile]]:
    """The manifest's model for ``spec`` (tensors read from its file) and the files that go
    into ``model_repository/<name>/1/``."""
    path = resolve_inside(source, spec.file, f"{where}.file")
    if not path.is_file():
        raise PackageError(f"{where}.file: {spec.file} is not a file in {source}")
    declared = backend in ("pytorch", "python")
    if declared and (spec.inputs is None or spec.outputs is None):
        raise PackageError(
            f"{where}: backend {backend} needs inputs and outputs declared (name, data_type, "
            "dims): its model file does not record them"
        )
    if not declared and (spec.inputs is not None or spec.outputs is not None):
        raise PackageError(
            f"{where}: remove inputs and outputs: backend {backend} reads them from {spec.file}"
        )
    if spec.fil is not None and backend != "fil":
        raise PackageError(f"{where}: remove fil: it belongs to backend fil only")
    fil = None
    if backend == "fil":
        options = spec.fil or FilOptions()
        if spec.max_batch_size < 1:
            raise PackageError(f"{where}: backend fil batches rows: set max_batch_size, e.g. 1024")
        model_type = fil_model_type(path, options.model_type)
        inputs, outputs, fil = read_fil(path, model_type, options.predict_proba, options.threshold)
    elif backend == "onnxruntime":
        inputs, outputs = read_onnx(path, spec.max_batch_size)
    else:
        assert spec.inputs is not None and spec.outputs is not None  # checked above
        inputs, outputs = spec.inputs, spec.outputs
        if backend == "pytorch":
            check_torchscript(path, inputs, outputs, spec.max_batch_size)
    folder = f"{MODEL_REPOSITORY}/{name}/1"
    file_name = model_file_name(backend, fil)
    if backend == "python":
        if path.name != file_name:
            raise PackageError(
                f"{where}.file: {spec.file}: Triton's python backend loads {file_name}; rename it"
            )
        # Its helpers beside model.py go with it, as for the python backend.
        parent = str(Path(spec.file).parent)
        base = "" if parent == "." else parent + "/"
        placed = [
            SourceFile(f"{folder}/{f.arcname.removeprefix(base)}", f.source, f.origin)
            for f in collect(source, spec.file if parent == "." else parent, f"{where}.file")
        ]
    else:
        placed = [SourceFile(f"{folder}/{file_name}", path, f"{where}.file")]
    try:
        model = TritonModel(
            name=name,
            backend=backend,
            file=f"{folder}/{file_name}",
            inputs=inputs,
            outputs=outputs,
            max_batch_size=spec.max_batch_size,
            dynamic_batching=spec.dynamic_batching,
            instance_group=spec.instance_group,
            fil=fil,
        )
    except ValidationError as exc:
        raise field_error(where, exc) from exc
    return model, sorted(placed, key=lambda f: f.arcname)


def resolve_ensemble(
    source: Path, spec: EnsembleSpec, model_id: str
) -> tuple[list[TritonModel], Ensemble, list[SourceFile]]:
    """The ensemble's models (tensors read from their files), the ensemble with its tensors
    derived from the steps, and the files of ``model_repository/``."""
    models: list[TritonModel] = []
    files: list[SourceFile] = []
    for i, member in enumerate(spec.models):
        where = f"ensemble.models.{i}"
        if member.name is None or member.backend is None:
            raise PackageError(f"{where}: an ensemble's model needs a name and a backend")
        if member.name == model_id:
            raise PackageError(
                f"{where}: name {member.name} is the ensemble's own (model_id); rename the model"
            )
        model, placed = resolve_model(source, member, member.name, member.backend, where)
        models.append(model)
        files += placed
    produced = check_steps(spec.steps, models, spec.max_batch_size)
    consumed = _consumed(models, spec.steps)
    missing = [name for name in spec.outputs if name not in produced]
    if missing:
        raise PackageError(
            f"ensemble.outputs: {', '.join(missing)} is produced by no step; map a model "
            "output to it in a step's output_map"
        )
    inputs = [
        t.model_copy(update={"name": name}) for name, t in consumed.items() if name not in produced
    ]
    if not inputs:
        raise PackageError(
            "ensemble.steps: every tensor a step reads is produced by another step; the "
            "ensemble needs at least one input from the caller"
        )
    outputs = [produced[name].model_copy(update={"name": name}) for name in spec.outputs]
    ensemble = Ensemble(
        steps=spec.steps, inputs=inputs, outputs=outputs, max_batch_size=spec.max_batch_size
    )
    check_ensemble(ensemble, models)
    return models, ensemble, files


def _consumed(models: list[TritonModel], steps: list[EnsembleStep]) -> dict[str, TensorSpec]:
    """Ensemble tensor name -> the first model input mapped to it (steps already checked)."""
    by_name = {m.name: m for m in models}
    found: dict[str, TensorSpec] = {}
    for step in steps:
        inputs = {t.name: t for t in by_name[step.model].inputs}
        for model_tensor, ensemble_tensor in step.input_map.items():
            found.setdefault(ensemble_tensor, inputs[model_tensor])
    return found


def repository_configs(
    model_id: str, models: list[TritonModel], ensemble: Ensemble | None
) -> dict[str, str]:
    """``config.pbtxt`` text by model name: every model, and the ensemble as ``model_id``."""
    configs = {model.name: model_config(model) for model in models}
    if ensemble is not None:
        configs[model_id] = ensemble_config(model_id, ensemble)
    return configs


def check_model_file(folder: Path, model: TritonModel) -> None:
    """Read ``model``'s file in the version ``folder`` again and raise `PackageError` where its
    tensors are not the manifest's (``package verify``)."""
    path = folder / model.file
    if model.backend == "python":
        return  # a python model's tensors are what the manifest declares
    if model.backend == "pytorch":
        check_torchscript(path, model.inputs, model.outputs, model.max_batch_size)
        return
    if model.backend == "fil":
        assert model.fil is not None  # TritonModel's own check
        inputs, outputs, fil = read_fil(
            path, model.fil.model_type, model.fil.predict_proba, model.fil.threshold
        )
        if fil != model.fil:
            raise PackageError(
                f"{model.file}: is_classifier is {fil.is_classifier} in the file, the manifest "
                f"says {model.fil.is_classifier}; rebuild the package"
            )
    else:
        inputs, outputs = read_onnx(path, model.max_batch_size)
    for side, read, listed in (
        ("inputs", inputs, model.inputs),
        ("outputs", outputs, model.outputs),
    ):
        if read != listed:
            shown = ", ".join(f"{t.name} {t.data_type} {t.dims}" for t in read)
            raise PackageError(
                f"{model.file}: the file's {side} are {shown}, not the manifest's; rebuild the "
                "package from this model file"
            )
