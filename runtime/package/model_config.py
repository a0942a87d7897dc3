"""``config.pbtxt`` of the non-LLM models, in Triton's own ``ModelConfig`` schema (tritonclient's
``model_config_pb2``): a field Triton lacks fails here, and protobuf escapes the names."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.package.model_files import model_file_name
from runtime.package.triton_models import Ensemble, TensorSpec, TritonModel

__all__ = ["ensemble_config", "model_config", "tensor"]


def tensor(spec: TensorSpec, message: type[Any]) -> Any:
    """One ``ModelInput`` or ``ModelOutput``; only inputs have ``optional`` in Triton's schema."""
    optional = {"optional": True} if spec.optional else {}
    return message(
        name=spec.name, data_type=mc.DataType.Value(spec.data_type), dims=spec.dims, **optional
    )


def model_config(model: TritonModel) -> str:
    """The ``config.pbtxt`` of one model (its file under the backend's default file name)."""
    config = mc.ModelConfig(
        name=model.name,
        backend=model.backend,
        max_batch_size=model.max_batch_size,
        default_model_filename=model_file_name(model.backend, model.fil),
        instance_group=[
            mc.ModelInstanceGroup(
                count=model.instance_group.count,
                kind=mc.ModelInstanceGroup.Kind.Value(model.instance_group.kind),
            )
        ],
    )
    if model.dynamic_batching is not None:
        config.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                max_queue_delay_microseconds=model.dynamic_batching.max_queue_delay_microseconds,
                preferred_batch_size=model.dynamic_batching.preferred_batch_size,
            )
        )
    config.input.extend(tensor(t, mc.ModelInput) for t in model.inputs)
    config.output.extend(tensor(t, mc.ModelOutput) for t in model.outputs)
    if model.fil is not None:
        # The FIL backend reads every parameter as a string and converts it itself.
        values = {
            "model_type": model.fil.model_type,
            "is_classifier": _flag(model.fil.is_classifier),
            "predict_proba": _flag(model.fil.predict_proba),
            "threshold": repr(model.fil.threshold),
        }
        for key, value in values.items():
            config.parameters[key].string_value = value
    return str(text_format.MessageToString(config))


def ensemble_config(name: str, ensemble: Ensemble) -> str:
    """The ``config.pbtxt`` of the ensemble that chains the package's models as ``name``."""
    config = mc.ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=ensemble.max_batch_size,
        ensemble_scheduling=mc.ModelEnsembling(
            step=[
                mc.ModelEnsembling.Step(
                    model_name=step.model,
                    model_version=-1,
                    input_map=step.input_map,
                    output_map=step.output_map,
                )
                for step in ensemble.steps
            ]
        ),
    )
    config.input.extend(tensor(t, mc.ModelInput) for t in ensemble.inputs)
    config.output.extend(tensor(t, mc.ModelOutput) for t in ensemble.outputs)
    return str(text_format.MessageToString(config))


def _flag(value: bool) -> str:
    return "true" if value else "false"
