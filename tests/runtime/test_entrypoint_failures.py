"""Each start-up stage failing on purpose: exit 10 + stage, one line naming stage and fix."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from operations.publish import publish
from runtime.package import MANIFEST_NAME, load_manifest
from runtime.package.build import file_entry
from tests.runtime.archivemaker import add_and_seal, file_member
from tests.runtime.pod import Pod, infer, port_refuses
from tests.runtime.wheelmaker import make_source, make_toy_plugin


def failure_line(err: str) -> str:
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert len(lines) == 1, err
    assert "; fix: " in lines[0]
    return lines[0]


def test_checksum_mismatch_stops_at_locate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    archive = pod.root / "version" / "package.tar"
    data = bytearray(archive.read_bytes())
    data[700] ^= 0x01
    archive.write_bytes(bytes(data))
    code, err = pod.run_to_exit()
    assert code == 11
    assert "stage 1/8 locate failed: checksum mismatch for package.tar" in failure_line(err)


def test_full_weight_verification_catches_a_flipped_byte(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    weights = pod.root / "version" / "weights" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0x01
    weights.write_bytes(bytes(data))
    pod.env["LLM_SERVING_VERIFY_WEIGHTS"] = "true"
    code, err = pod.run_to_exit()
    assert code == 11
    assert "checksum mismatch for weights/model.safetensors" in failure_line(err)


def test_missing_package_without_fallback_stops_at_locate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_PACKAGE_PATH"] = str(tmp_path / "nowhere")
    code, err = pod.run_to_exit()
    assert code == 11 and "LLM_SERVING_PACKAGE_S3_URI" in failure_line(err)


def test_corrupt_archive_with_a_link_stops_at_unpack(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    version = pod.root / "version"
    archive = version / "package.tar"
    link = tarfile.TarInfo("tokenizer/evil.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with tarfile.open(archive, "a") as tar:
        tar.addfile(link)
    # Re-seal the manifest so only the unpack checks can notice.
    manifest = load_manifest(version / MANIFEST_NAME)
    sealed = manifest.model_copy(update={"archive": file_entry(archive, "package.tar")})
    (version / MANIFEST_NAME).write_text(sealed.to_json())
    code, err = pod.run_to_exit()
    assert code == 12
    line = failure_line(err)
    assert "stage 2/8 unpack failed: archive member tokenizer/evil.json is a link" in line
    assert not (pod.root / "work" / "package" / "tokenizer" / "evil.json").exists()


def test_archive_with_a_3000_folder_path_stops_at_unpack_naming_it(tmp_path: Path) -> None:
    # It was "unexpected RecursionError at <frozen posixpath>", naming no member.
    pod = Pod.create(tmp_path)
    name = "d/" * 3_000 + "f.json"
    add_and_seal(pod.root / "version", [file_member(name)])  # stage 1 passes: only stage 2 refuses
    code, err = pod.run_to_exit()
    assert code == 12
    line = failure_line(err)
    assert "stage 2/8 unpack failed: archive member d/d/d/" in line
    assert "has a 6006-byte path, over the 1024 a package may use" in line
    assert "unexpected" not in line
    assert not (pod.root / "work" / "package" / "d").exists()


def test_plugin_that_upgrades_vllm_stops_at_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", "vllm>=0.30")
    # Package it as an older builder without the pin check would have.
    monkeypatch.setattr("runtime.package.build.check_against_pins", lambda *a: None)
    pod = Pod.create(tmp_path, source=source)
    code, err = pod.run_to_exit()
    assert code == 13
    line = failure_line(err)
    assert "stage 3/8 plugins failed: plugin toy-plugin requires 'vllm>=0.30'" in line
    assert "vllm is 0.27.1" in line


def test_missing_multiproc_dir_setting_stops_at_metrics(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env.pop("PROMETHEUS_MULTIPROC_DIR")
    code, err = pod.run_to_exit()
    assert code == 14 and "PROMETHEUS_MULTIPROC_DIR is not set" in failure_line(err)


def test_incompatible_vllm_stops_at_compat(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path, light_matrix=False)
    pod.env["LLM_SERVING_TRITON_RELEASE"] = "26.07"
    code, err = pod.run_to_exit()
    assert code == 15
    line = failure_line(err)
    assert "stage 5/8 compat failed: installed vllm 0.27.1 does not match Triton 26.07" in line


def test_backend_module_that_does_not_import_stops_at_compat(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    matrix = Path(pod.env["LLM_SERVING_COMPAT_MATRIX"])
    matrix.write_text(matrix.read_text().replace('["json"]', '["json", "no_such_backend_mod"]'))
    code, err = pod.run_to_exit()
    assert code == 15
    assert "cannot import no_such_backend_mod" in failure_line(err)


def test_parallel_size_that_is_not_a_number_fails_locate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    path = pod.root / "version" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["engine_args"]["tensor_parallel_size"] = "two"
    path.write_text(json.dumps(manifest))
    code, err = pod.run_to_exit()
    assert code == 11, err
    line = failure_line(err)
    assert "stage 1/8 locate failed: manifest" in line
    assert "engine_args.tensor_parallel_size is 'two', not a positive integer" in line
    assert "rebuild with llm-serving package build" in line
    assert "Traceback" not in err


def test_missing_tritonserver_stops_at_start(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_TRITONSERVER"] = str(tmp_path / "no-tritonserver")
    code, err = pod.run_to_exit()
    assert code == 17 and "stage 7/8 start failed: cannot run" in failure_line(err)


def test_model_that_never_becomes_ready_stops_at_gate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["KSERVE_STANDIN_LOAD_SECONDS"] = "600"
    pod.env["LLM_SERVING_READY_TIMEOUT_SECONDS"] = "2"
    pod.start()
    assert port_refuses(pod.port("public_grpc"))
    code, err = pod.wait_exit(timeout=60)
    assert code == 18, err
    assert "stage 8/8 gate failed: model toy not ready after 2s" in failure_line(err)
    assert port_refuses(pod.port("public_grpc"))


def test_s3_fallback_warns_and_serves(
    tmp_path: Path, s3_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    pod = Pod.create(tmp_path)
    publish(s3_client, pod.root / "version", bucket)
    pod.env.update(s3_env)
    pod.env["LLM_SERVING_PACKAGE_PATH"] = str(tmp_path / "not-restored")
    pod.env["LLM_SERVING_PACKAGE_S3_URI"] = f"s3://{bucket}/models/toy/v1/"
    pod.start().wait_ready()
    assert infer(pod.port("public_grpc"), "the fox") != ""
    code, err = pod.terminate()
    assert code == 0
    assert "cold start will be slow" in err


def test_weights_downloaded_from_s3_are_always_hashed(
    tmp_path: Path, s3_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    pod = Pod.create(tmp_path)
    publish(s3_client, pod.root / "version", bucket)
    key = "models/toy/v1/weights/model.safetensors"
    data = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[10] ^= 0x01  # same size: only the sha256 can tell
    s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    pod.env.update(s3_env)
    pod.env["LLM_SERVING_PACKAGE_PATH"] = str(tmp_path / "not-restored")
    pod.env["LLM_SERVING_PACKAGE_S3_URI"] = f"s3://{bucket}/models/toy/v1/"
    assert "LLM_SERVING_VERIFY_WEIGHTS" not in pod.env
    code, err = pod.run_to_exit()
    assert code == 11
    assert "checksum mismatch for weights/model.safetensors" in failure_line(err)


def test_invalid_setting_exits_2_naming_it(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_HEALTH_PORT"] = "eighty"
    code, err = pod.run_to_exit()
    assert code == 2 and "invalid setting LLM_SERVING_HEALTH_PORT: " in err


def test_version_folder_derived_from_model_id_and_version(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    cache = tmp_path / "cache"
    (cache / "toy").mkdir(parents=True)
    (pod.root / "version").rename(cache / "toy" / "v1")
    pod.env.pop("LLM_SERVING_PACKAGE_PATH")
    pod.env.update(
        {
            "LLM_SERVING_MODEL_CACHE_ROOT": str(cache),
            "LLM_SERVING_MODEL_ID": "toy",
            "LLM_SERVING_MODEL_VERSION": "v2",
        }
    )
    code, err = pod.run_to_exit()  # v2 is not there
    assert code == 11 and str(cache / "toy" / "v2") in failure_line(err)
    pod.env["LLM_SERVING_MODEL_VERSION"] = "v1"
    pod.start().wait_ready()
    assert infer(pod.port("public_grpc"), "the fox") != ""
    assert pod.terminate()[0] == 0
