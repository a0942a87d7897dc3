"""Rendering the Triton model repository from a manifest (vllm and python backends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.compat import load_matrix
from runtime.entrypoint.render import render_repository, vllm_backend_for
from runtime.frontend.tensors import FRONTEND_INPUTS, FRONTEND_OUTPUTS
from runtime.package import build_package
from runtime.serving_backend import BACKEND_NAME, RESPONSE_HOOK
from tests.runtime.wheelmaker import make_source

# A processor that no installed entry point registers: model.json must name it.
PROCESSOR = "runtime.constraints.processor:ConstraintLogitsProcessor"
PLUGIN = "runtime.constraints.plugin:ConstraintProcessorEntryPoint"


def _config(model: Path) -> mc.ModelConfig:
    """``config.pbtxt`` parsed as Triton parses it, into Triton's own schema (an unknown field
    or a malformed value raises)."""
    return text_format.Parse((model / "config.pbtxt").read_text(), mc.ModelConfig())


def _kind(model: Path) -> str:
    (group,) = _config(model).instance_group
    return mc.ModelInstanceGroup.Kind.Name(group.kind)


def test_vllm_backend_repository(tmp_path: Path) -> None:
    source = make_source(
        tmp_path / "src",
        engine_args={
            "tensor_parallel_size": 2,
            "max_model_len": 64,
            "logits_processors": ["a:B", PLUGIN, "a:B"],
        },
    )
    manifest = build_package(source, tmp_path / "v")
    model = render_repository(
        manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", PROCESSOR
    )
    config = _config(model)
    # The serving image's backend (the stock one plus prompt_logprobs), with the stock
    # backend's parameters: it reads them itself.
    assert config.name == "toy" and config.backend == BACKEND_NAME
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 0
    assert _kind(model) == "KIND_MODEL"  # tensor parallel 2
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "REPORT_CUSTOM_METRICS": "true",
        "ENABLE_VLLM_HEALTH_CHECK": "true",
    }
    args = json.loads((model / "1" / "model.json").read_text())
    assert args["model"] == str(tmp_path / "v" / "weights")
    assert args["tokenizer"] == str(tmp_path / "u" / "tokenizer")
    assert args["disable_log_stats"] is False
    # Our entry point is installed, so vLLM loads it already: naming it again would double it.
    assert args["logits_processors"] == ["a:B", PROCESSOR]
    assert args["max_model_len"] == 64


def test_single_gpu_uses_kind_gpu_and_rerender_replaces(tmp_path: Path) -> None:
    manifest = build_package(make_source(tmp_path / "src"), tmp_path / "v")
    repo = tmp_path / "repo"
    (repo / "stale").mkdir(parents=True)
    model = render_repository(manifest, tmp_path / "v", tmp_path / "u", repo, PROCESSOR)
    assert _kind(model) == "KIND_GPU"
    model = render_repository(manifest, tmp_path / "v", tmp_path / "u", repo, PLUGIN)
    assert json.loads((model / "1" / "model.json").read_text())["logits_processors"] == []
    assert sorted(p.name for p in repo.iterdir()) == ["toy"]


@pytest.mark.parametrize(
    ("setting", "parallel", "kind"),
    [
        ("auto", 1, "KIND_GPU"),
        ("auto", 2, "KIND_MODEL"),
        ("model", 1, "KIND_MODEL"),
        ("gpu", 1, "KIND_GPU"),
    ],
)
def test_instance_kind_setting(tmp_path: Path, setting: str, parallel: int, kind: str) -> None:
    engine_args = {"max_model_len": 64, "tensor_parallel_size": parallel}
    manifest = build_package(make_source(tmp_path / "src", engine_args=engine_args), tmp_path / "v")
    model = render_repository(
        manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", PROCESSOR,
        kind_setting=setting,
    )  # fmt: skip
    assert _kind(model) == kind


def test_python_backend_repository(tmp_path: Path) -> None:
    spec = {
        "inputs": [
            {"name": t.name, "data_type": t.data_type, "dims": [1], "optional": not t.required}
            for t in FRONTEND_INPUTS
        ],
        "outputs": [
            {"name": t.name, "data_type": t.data_type, "dims": [-1]} for t in FRONTEND_OUTPUTS
        ],
    }
    source = make_source(tmp_path / "src", backend="python", python_model=spec)
    (source / "python").mkdir()
    (source / "python" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (source / "python" / "helpers.py").write_text("X = 1\n")
    manifest = build_package(source, tmp_path / "v")
    unpacked = tmp_path / "u"
    unpacked.mkdir()
    (unpacked / "python").mkdir()
    for name in ("model.py", "helpers.py"):
        (unpacked / "python" / name).write_text((source / "python" / name).read_text())
    # A package's own model.json must not replace the generated one (no engine args, no stats).
    (unpacked / "python" / "model.json").write_text('{"model": "/elsewhere"}')
    model = render_repository(manifest, tmp_path / "v", unpacked, tmp_path / "repo", PROCESSOR)
    config = _config(model)
    assert config.backend == "python" and _kind(model) == "KIND_MODEL"
    inputs = {t.name: t for t in config.input}
    assert inputs["text_input"].data_type == mc.TYPE_STRING
    assert list(inputs["text_input"].dims) == [1] and not inputs["text_input"].optional
    assert inputs["stream"].data_type == mc.TYPE_BOOL and inputs["stream"].optional
    assert len(config.input) + len(config.output) == len(FRONTEND_INPUTS) + len(FRONTEND_OUTPUTS)
    assert (model / "1" / "model.py").read_text().startswith("class TritonPythonModel")
    assert (model / "1" / "helpers.py").is_file()
    rendered = json.loads((model / "1" / "model.json").read_text())
    assert rendered["disable_log_stats"] is False and rendered["model"] != "/elsewhere"


def test_scoring_backend_only_where_the_matrix_records_its_hook(tmp_path: Path) -> None:
    matrix = load_matrix()
    chosen = {pair.triton: vllm_backend_for(pair) for pair in matrix.pairs}
    assert chosen[matrix.default_triton] == (BACKEND_NAME, None)
    for release, (backend, why) in chosen.items():
        hook = matrix.for_triton(release).response_hook
        assert (backend == BACKEND_NAME) == (hook == RESPONSE_HOOK)
        if backend != BACKEND_NAME:
            assert backend == "vllm" and why is not None and release in why and "501" in why
    # 25.10's stock backend builds responses in TritonPythonModel._create_response, so it gets
    # the stock backend; 25.11's vllm_backend branch already has utils/request.py.
    assert chosen["25.10"][0] == "vllm"
    assert "TritonPythonModel._create_response" in (chosen["25.10"][1] or "")
    assert chosen["25.11"] == (BACKEND_NAME, None)

    manifest = build_package(make_source(tmp_path / "src"), tmp_path / "v")
    backend, _ = vllm_backend_for(matrix.for_triton("25.10"))
    model = render_repository(
        manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", PROCESSOR, backend
    )
    config = _config(model)
    assert config.backend == "vllm"
    assert config.parameters["REPORT_CUSTOM_METRICS"].string_value == "true"


def _rendered_args(tmp_path: Path, engine_args: dict, structured_outputs: bool = True) -> dict:
    source = make_source(tmp_path / "src", engine_args={"max_model_len": 64, **engine_args})
    manifest = build_package(source, tmp_path / "v")
    model = render_repository(
        manifest,
        tmp_path / "v",
        tmp_path / "u",
        tmp_path / "repo",
        PROCESSOR,
        structured_outputs=structured_outputs,
    )
    return json.loads((model / "1" / "model.json").read_text())


def test_structured_outputs_settings_a_weak_model_can_end_with(tmp_path: Path) -> None:
    args = _rendered_args(tmp_path, {})
    assert args["structured_outputs_config"] == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }


def test_the_manifests_structured_outputs_keys_win(tmp_path: Path) -> None:
    given = {"structured_outputs_config": {"backend": "xgrammar", "reasoning_parser": "x"}}
    assert _rendered_args(tmp_path / "a", given)["structured_outputs_config"] == {
        "backend": "xgrammar",
        "disable_any_whitespace": True,
        "reasoning_parser": "x",
    }
    # vLLM refuses disable_any_whitespace for outlines: it is left out unless asked for.
    given = {"structured_outputs_config": {"backend": "outlines"}}
    assert _rendered_args(tmp_path / "b", given)["structured_outputs_config"] == {
        "backend": "outlines"
    }


def test_no_structured_outputs_config_for_a_vllm_without_it(tmp_path: Path) -> None:
    """vLLM 0.10 (the guided_decoding pairs) has no structured_outputs_config argument."""
    assert "structured_outputs_config" not in _rendered_args(tmp_path, {}, False)
