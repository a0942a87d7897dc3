"""The check that an ensemble's steps chain: each step names a model of the package, maps its
tensors by their real names, and reads tensors of the type and shape another step produced."""

from __future__ import annotations

from runtime.package.errors import PackageError
from runtime.package.triton_models import (
    Ensemble,
    EnsembleStep,
    TensorSpec,
    TritonModel,
    dims_agree,
)

__all__ = ["check_ensemble", "check_steps"]


def check_steps(
    steps: list[EnsembleStep], models: list[TritonModel], max_batch_size: int
) -> dict[str, TensorSpec]:
    """Raise `PackageError` unless each step names a model, maps its real tensors (every
    required input) and batches as the ensemble does; returns each produced tensor's spec."""
    by_name = {m.name: m for m in models}
    producers: dict[str, tuple[str, TensorSpec]] = {}
    for i, step in enumerate(steps):
        model = by_name.get(step.model)
        if model is None:
            raise PackageError(
                f"ensemble.steps.{i}: model {step.model} is not one of the package's models "
                f"({', '.join(by_name)})"
            )
        if max_batch_size > model.max_batch_size:
            raise PackageError(
                f"ensemble.steps.{i}: model {model.name} batches up to {model.max_batch_size}, "
                f"the ensemble {max_batch_size}; lower the ensemble's max_batch_size"
            )
        if max_batch_size == 0 and model.max_batch_size > 0:
            # Triton passes an unbatched ensemble's full shapes to every step.
            raise PackageError(
                f"ensemble.steps.{i}: model {model.name} batches (max_batch_size "
                f"{model.max_batch_size}), the ensemble does not; set the ensemble's "
                "max_batch_size"
            )
        _check_map(i, model, step.input_map, model.inputs, "input_map")
        _check_map(i, model, step.output_map, model.outputs, "output_map")
        for model_tensor, name in step.output_map.items():
            if name in producers:
                raise PackageError(
                    f"ensemble.steps.{i}: tensor {name} is already produced by model "
                    f"{producers[name][0]}; map this output to another name"
                )
            producers[name] = (model.name, next(t for t in model.outputs if t.name == model_tensor))
    return {name: spec for name, (_, spec) in producers.items()}


def check_ensemble(ensemble: Ensemble, models: list[TritonModel]) -> None:
    """Raise `PackageError` (a ValueError) naming the first way the steps do not chain: those
    of `check_steps`, then each tensor a step reads against the one it gets."""
    produced = check_steps(ensemble.steps, models, ensemble.max_batch_size)
    by_name = {m.name: m for m in models}
    sources = {t.name: t for t in ensemble.inputs}
    for name, spec in produced.items():
        sources.setdefault(name, spec)
    for i, step in enumerate(ensemble.steps):
        model = by_name[step.model]
        for model_tensor, name in step.input_map.items():
            wanted = next(t for t in model.inputs if t.name == model_tensor)
            given = sources.get(name)
            if given is None:
                raise PackageError(
                    f"ensemble.steps.{i}: tensor {name} is neither an ensemble input nor "
                    "produced by a step"
                )
            if given.data_type != wanted.data_type or not dims_agree(given.dims, wanted.dims):
                raise PackageError(
                    f"ensemble.steps.{i}: model {model.name} input {model_tensor} is "
                    f"{wanted.data_type} {wanted.dims}, but tensor {name} is {given.data_type} "
                    f"{given.dims}; make the steps agree"
                )


def _check_map(
    i: int, model: TritonModel, mapping: dict[str, str], tensors: list[TensorSpec], side: str
) -> None:
    names = {t.name for t in tensors}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise PackageError(
            f"ensemble.steps.{i}.{side}: model {model.name} has no tensor {', '.join(unknown)}; "
            f"it has {', '.join(sorted(names))}"
        )
    if side == "input_map":
        unmapped = sorted(t.name for t in tensors if not t.optional and t.name not in mapping)
        if unmapped:
            raise PackageError(
                f"ensemble.steps.{i}.input_map: model {model.name} input "
                f"{', '.join(unmapped)} is not mapped; map it to an ensemble tensor"
            )
