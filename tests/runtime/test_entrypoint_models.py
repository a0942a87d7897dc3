"""The entrypoint serves a package of Triton's other backends (here an XGBoost model for FIL):
no vLLM to check at stage 5, the package's own repository rendered at stage 6, gRPC only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import xgboost
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.entrypoint.render import render_repository
from runtime.package import build_package
from tests.runtime.modelmaker import (
    FEATURES,
    ensemble_source,
    model_source,
    training_data,
    xgboost_classifier,
)
from tests.runtime.pod import Pod


def _tree_pod(root: Path) -> tuple[Pod, xgboost.Booster]:
    path = xgboost_classifier(root / "src" / "trees" / "clf.json")
    source = model_source(
        root / "src", backend="fil", model={"file": "trees/clf.json", "max_batch_size": 64}
    )
    pod = Pod.create(root, light_matrix=False, source=source)
    return pod, xgboost.Booster(model_file=str(path))


def test_a_tree_model_is_served_without_a_vllm_check(tmp_path: Path) -> None:
    pod, booster = _tree_pod(tmp_path)
    try:
        pod.start().wait_ready()
        x, _ = training_data(rows=12, seed=3)
        request = grpcclient.InferInput("input__0", [len(x), FEATURES], "FP32")
        request.set_data_from_numpy(x)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{pod.port('public_grpc')}")
        labels = client.infer("tab", [request]).as_numpy("output__0")
        expected = (booster.predict(xgboost.DMatrix(x)) > 0.5).astype(np.float32)
        np.testing.assert_array_equal(labels.reshape(-1), expected)

        model = pod.root / "work" / "model_repository" / "tab"
        config = text_format.Parse((model / "config.pbtxt").read_text(), mc.ModelConfig())
        assert config.backend == "fil" and config.max_batch_size == 64
        served = model / "1" / "xgboost.json"
        assert served.is_symlink()  # the verified copy, never a second one
        assert served.resolve() == (
            pod.root / "version" / "model_repository" / "tab" / "1" / "xgboost.json"
        )
        assert not (model / "1" / "model.json").exists()
    finally:
        code, err = pod.terminate()
    assert code == 0, err
    assert "Triton 26.08: backend fil runs no vLLM, none checked" in err
    assert "compatible: Triton" not in err


def test_embedded_mode_refuses_a_tree_model(tmp_path: Path) -> None:
    pod, _ = _tree_pod(tmp_path)
    pod.env["LLM_SERVING_SERVING_MODE"] = "embedded"
    code, err = pod.run_to_exit()
    assert code == 17, err
    (line,) = [line for line in err.splitlines() if "failed:" in line]
    assert "stage 7/8 start failed: embedded mode puts the OpenAI frontend in front" in line
    assert "tab is a fil model, served over gRPC only" in line
    assert "set it to standalone" in line


def test_an_ensemble_renders_every_step(tmp_path: Path) -> None:
    version = tmp_path / "v"
    manifest = build_package(ensemble_source(tmp_path / "src"), version)
    repository = tmp_path / "repo"
    # The logits processor is an LLM's: nothing here names it.
    processor = "runtime.constraints.processor:ConstraintLogitsProcessor"
    model = render_repository(manifest, version, tmp_path / "u", repository, processor)
    assert model == repository / "tab"
    configs = {
        p.parent.name: text_format.Parse(p.read_text(), mc.ModelConfig())
        for p in repository.glob("*/config.pbtxt")
    }
    assert sorted(configs) == ["post", "pre", "tab", "trees"]
    assert configs["tab"].platform == "ensemble" and (model / "1").is_dir()
    assert [s.model_name for s in configs["tab"].ensemble_scheduling.step] == [
        "pre",
        "trees",
        "post",
    ]
    linked = sorted(str(p.relative_to(repository)) for p in repository.rglob("*") if p.is_symlink())
    assert linked == [
        "post/1/helpers.py",
        "post/1/model.py",
        "pre/1/helpers.py",
        "pre/1/model.py",
        "trees/1/xgboost.json",
    ]
    packaged = version / "model_repository"
    for path in linked:
        assert (repository / path).read_bytes() == (packaged / path).read_bytes()
