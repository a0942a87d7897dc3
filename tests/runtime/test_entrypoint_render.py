"""Rendering the Triton model repository from a manifest (vllm and python backends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.compat import load_matrix
from runtime.entrypoint.render import render_repository, vllm_backend_for
from runtime.frontend.tensors import FRONTEND_INPUTS, FRONTEND_OUTPUTS
from runtime.package import build_package
from runtime.serving_backend import BACKEND_NAME, RESPONSE_HOOK
from tests.runtime.wheelmaker import make_source

# A processor that no installed entry point registers: model.json must name it.
PROCESSOR = "runtime.constraints.processor:ConstraintLogitsProcessor"
PLUGIN = "runtime.constraints.plugin:ConstraintProcessorEntryPoint"


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
    config = (model / "config.pbtxt").read_text()
    # The serving image's backend (the stock one plus prompt_logprobs), with the stock
    # backend's parameters: it reads them itself.
    assert 'name: "toy"' in config and f'backend: "{BACKEND_NAME}"' in config
    assert "decoupled: true" in config and "max_batch_size: 0" in config
    assert "kind: KIND_MODEL" in config  # tensor parallel 2
    for key in ("REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK"):
        assert f'key: "{key}"\n  value: {{ string_value: "true" }}' in config
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
    assert "kind: KIND_GPU" in (model / "config.pbtxt").read_text()
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
    assert f"kind: {kind}\n" in (model / "config.pbtxt").read_text()


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
    config = (model / "config.pbtxt").read_text()
    assert 'backend: "python"' in config
    assert 'name: "text_input"\n    data_type: TYPE_STRING\n    dims: [ 1 ]' in config
    assert 'name: "stream"\n    data_type: TYPE_BOOL\n    dims: [ 1 ]\n    optional: true' in config
    assert config.count("data_type:") == len(FRONTEND_INPUTS) + len(FRONTEND_OUTPUTS)
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
    # 25.10's stock backend builds responses in TritonPythonModel._create_response; 25.11's
    # hook is not established: both get the stock backend.
    assert chosen["25.10"][0] == chosen["25.11"][0] == "vllm"
    assert "not established" in (chosen["25.11"][1] or "")

    manifest = build_package(make_source(tmp_path / "src"), tmp_path / "v")
    backend, _ = vllm_backend_for(matrix.for_triton("25.11"))
    model = render_repository(
        manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", PROCESSOR, backend
    )
    config = (model / "config.pbtxt").read_text()
    assert 'backend: "vllm"' in config
    assert 'key: "REPORT_CUSTOM_METRICS"\n  value: { string_value: "true" }' in config


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
