"""The instance kind ``auto`` renders: ``KIND_GPU`` only for an engine on one GPU, counted as
vLLM counts them (for ``KIND_GPU`` the stock vLLM backend makes one device visible)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.entrypoint.render import engine_gpus, instance_kind, render_repository
from runtime.package import build_package
from tests.runtime.wheelmaker import make_source

PROCESSOR = "runtime.constraints.processor:ConstraintLogitsProcessor"

# Each a combination vLLM 0.27.1's ParallelConfig accepts (it refuses PCP with DP).
ENGINES: list[tuple[dict[str, object], int]] = [
    ({}, 1),
    ({"decode_context_parallel_size": 1}, 1),
    ({"tensor_parallel_size": 2}, 2),
    ({"pipeline_parallel_size": 2}, 2),
    ({"prefill_context_parallel_size": 2}, 2),
    ({"data_parallel_size": 2}, 2),
    ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2}, 2),
    ({"tensor_parallel_size": 2, "prefill_context_parallel_size": 2}, 4),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 2}, 8),
]


@pytest.mark.parametrize(("engine_args", "gpus"), ENGINES)
def test_engine_gpus_counts_every_parallel_size(engine_args: dict[str, object], gpus: int) -> None:
    assert engine_gpus(engine_args) == gpus
    assert instance_kind(engine_args) == ("KIND_GPU" if gpus == 1 else "KIND_MODEL")


@pytest.mark.parametrize(("engine_args", "gpus"), ENGINES)
def test_engine_gpus_agrees_with_vllms_parallel_config(
    engine_args: dict[str, object], gpus: int
) -> None:
    parallel = pytest.importorskip("vllm.config").ParallelConfig
    assert parallel(**engine_args).world_size_across_dp == engine_gpus(engine_args) == gpus


@pytest.mark.parametrize(
    "engine_args", [{"prefill_context_parallel_size": 2}, {"data_parallel_size": 2}]
)
def test_context_and_data_parallel_engines_render_kind_model(
    tmp_path: Path, engine_args: dict[str, object]
) -> None:
    source = make_source(tmp_path / "src", engine_args={"max_model_len": 64, **engine_args})
    manifest = build_package(source, tmp_path / "v")
    model = render_repository(
        manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", PROCESSOR
    )
    config = text_format.Parse((model / "config.pbtxt").read_text(), mc.ModelConfig())
    (group,) = config.instance_group
    assert mc.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_MODEL"
