"""``engine_args`` values that the entrypoint and the frontend use (``max_model_len`` and the
parallel sizes) are positive integers, refused at build, at verify and at the pod's stage 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.stages import locate
from runtime.package import MANIFEST_NAME, PackageError, build_package, verify_package
from tests.runtime.wheelmaker import make_source

BAD_COUNTS = [
    ("max_model_len", "abc"),
    ("max_model_len", None),
    ("max_model_len", 0),
    ("max_model_len", -1),
    ("max_model_len", True),
    ("max_model_len", 128.0),
    ("tensor_parallel_size", 0),
    ("tensor_parallel_size", "2"),
    ("pipeline_parallel_size", False),
    ("data_parallel_size", -2),
]


@pytest.mark.parametrize(("key", "value"), BAD_COUNTS)
@pytest.mark.parametrize("mode", ["standalone", "embedded"])
def test_build_refuses_a_count_that_is_not_a_positive_integer(
    tmp_path: Path, mode: str, key: str, value: object
) -> None:
    args = {"max_model_len": 128, key: value}
    source = make_source(tmp_path / "src", serving_mode=mode, engine_args=args)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    message = str(err.value)
    assert "package.yaml: field engine_args" in message
    assert f"engine_args.{key} is {value!r}, not a positive integer" in message
    assert not (tmp_path / "out").exists()


def test_build_keeps_positive_counts(tmp_path: Path) -> None:
    args = {"max_model_len": 128, "tensor_parallel_size": 2, "pipeline_parallel_size": 1}
    source = make_source(tmp_path / "src", serving_mode="embedded", engine_args=args)
    assert build_package(source, tmp_path / "out").engine_args == args


@pytest.mark.parametrize("value", ["5", -2, 1.5, True, None])
def test_build_refuses_a_max_logprobs_that_is_not_a_count(tmp_path: Path, value: object) -> None:
    # The frontend refuses requests above it; vLLM's own "no cap" is -1.
    source = make_source(
        tmp_path / "src", engine_args={"max_model_len": 128, "max_logprobs": value}
    )
    with pytest.raises(PackageError, match=f"engine_args.max_logprobs is {value!r}, not a whole"):
        build_package(source, tmp_path / "out")


@pytest.mark.parametrize("value", [-1, 0, 5])
def test_build_keeps_a_max_logprobs_vllm_takes(tmp_path: Path, value: int) -> None:
    source = make_source(
        tmp_path / "src", engine_args={"max_model_len": 128, "max_logprobs": value}
    )
    assert build_package(source, tmp_path / "out").max_logprobs == value


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    return tmp_path / "out"


def _edit(version: Path, **fields: object) -> None:
    data = json.loads((version / MANIFEST_NAME).read_text())
    data.update(fields)
    (version / MANIFEST_NAME).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"engine_args": {"max_model_len": 128, "tensor_parallel_size": 0}},
            "engine_args.tensor_parallel_size is 0, not a positive integer",
        ),
        (
            {"serving_mode": "embedded", "engine_args": {"max_model_len": "abc"}},
            "engine_args.max_model_len is 'abc', not a positive integer",
        ),
        (
            {"serving_mode": "embedded", "engine_args": {}},
            "serving_mode embedded needs max_model_len",
        ),
    ],
    ids=["tensor_parallel_zero", "max_model_len_text", "embedded_without_max_model_len"],
)
def test_verify_and_stage_1_refuse_what_build_would(
    built: Path, tmp_path: Path, fields: dict[str, object], expected: str
) -> None:
    _edit(built, **fields)
    with pytest.raises(PackageError, match=f"manifest {built / MANIFEST_NAME}: field engine_args"):
        verify_package(built)
    with pytest.raises(StageFailed) as err:
        locate(built, None, tmp_path / "dl", verify_weights=False, expect=(None, None), warn=print)
    assert expected in str(err.value)
    assert "rebuild with llm-serving package build" in err.value.fix
