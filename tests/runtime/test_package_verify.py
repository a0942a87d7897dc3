"""``package verify|inspect`` catch corruption, bad manifests and mismatched python tensors."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from runtime.cli import app
from runtime.frontend.tensors import FRONTEND_INPUTS, FRONTEND_OUTPUTS
from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    build_package,
    describe,
    load_manifest,
    manifest_json_schema,
    verify_package,
)
from runtime.package.build import file_entry
from runtime.package.manifest import FileEntry, PythonModel, TensorSpec
from runtime.package.tensors import check_python_model
from tests.runtime.wheelmaker import make_source

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "runtime" / "package" / "manifest.schema.json"


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    return tmp_path / "out"


def test_fresh_build_verifies_and_inspects(built: Path) -> None:
    manifest = verify_package(built)
    summary = describe(built)
    assert summary["model"] == "toy/v1" and summary["format_version"] == 1
    assert summary["plugins"] == [f"toy-plugin==1.0 ({manifest.plugins[0].wheel})"]
    assert summary["weight_bytes"] == sum(e.size for e in manifest.weight_files)


def test_flipped_weight_byte_is_a_checksum_mismatch(built: Path) -> None:
    weights = built / "weights" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.write_bytes(bytes(data))
    verify_package(built, full=False)  # sizes still agree
    with pytest.raises(PackageError, match=r"checksum mismatch for weights/model\.safetensors"):
        verify_package(built)


def test_truncated_archive_is_reported_by_size(built: Path) -> None:
    archive = built / "package.tar"
    archive.write_bytes(archive.read_bytes()[:-1024])
    with pytest.raises(PackageError, match=r"package\.tar is \d+ bytes, the manifest says"):
        verify_package(built, full=False)


def test_missing_weight_file_is_named(built: Path) -> None:
    (built / "weights" / "config.json").unlink()
    with pytest.raises(PackageError, match=r"weights/config\.json is missing"):
        verify_package(built)


def test_archive_member_swapped_consistently_is_caught(built: Path) -> None:
    # Rewrite the archive with another catalog and fix up the archive's own checksum: only the
    # per-member hashes can tell.
    manifest = load_manifest(built / MANIFEST_NAME)
    archive = built / "package.tar"
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(archive, "w") as tar:
        for member, data in members:
            if member.name == "catalogs/titles.jsonl":
                data = data.replace(b'"t1"', b'"z1"')
            tar.addfile(member, io.BytesIO(data))
    from runtime.package.build import file_entry

    patched = manifest.model_copy(update={"archive": file_entry(archive, "package.tar")})
    (built / MANIFEST_NAME).write_text(patched.to_json())
    with pytest.raises(PackageError, match="checksum mismatch for archive member catalogs/titles"):
        verify_package(built)


def test_catalog_the_engine_cannot_read_is_refused(built: Path) -> None:
    # A consistent archive (fresh member and archive checksums) whose catalog is a JSON list:
    # only parsing it the way the constraint engine does can tell.
    bad = b'["t1", "t2"]\n'
    manifest = load_manifest(built / MANIFEST_NAME)
    archive = built / "package.tar"
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(archive, "w") as tar:
        for member, data in members:
            if member.name == "catalogs/titles.jsonl":
                data = bad
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    from runtime.package.build import file_entry

    entries = [
        e.model_copy(update={"size": len(bad), "sha256": hashlib.sha256(bad).hexdigest()})
        if e.path == "catalogs/titles.jsonl"
        else e
        for e in manifest.archive_files
    ]
    patched = manifest.model_copy(
        update={"archive": file_entry(archive, "package.tar"), "archive_files": entries}
    )
    (built / MANIFEST_NAME).write_text(patched.to_json())
    with pytest.raises(PackageError) as err:
        verify_package(built)
    assert "catalogs.0: catalog 'titles' (catalogs/titles.jsonl) is not a valid JSONL" in str(
        err.value
    )
    assert 'expected an object with keys "id" and "text"' in str(err.value)


def test_future_format_version_asks_for_a_rebuild(built: Path) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["format_version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError, match="format_version 2; this runtime reads format_version 1"):
        load_manifest(path)


@pytest.mark.parametrize(
    ("value", "said"),
    [(None, "no format_version"), (True, "format_version True"), ("1", "format_version '1'")],
)
def test_manifest_without_format_version_1_is_refused(
    built: Path, value: object, said: str
) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    if value is None:
        del data["format_version"]
    else:
        data["format_version"] = value
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError) as err:
        load_manifest(path)
    assert f"has {said}; this runtime reads format_version 1: rebuild the package" in str(err.value)


def test_manifest_with_duplicate_paths_is_refused(built: Path) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["weight_files"].append(data["weight_files"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError, match=r"weight_files lists 'weights/[^']+' twice"):
        load_manifest(path)


def test_manifest_with_traversal_path_is_refused(built: Path) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["weight_files"][0]["path"] = "../../etc/passwd"
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError, match=r"field weight_files\.0\.path"):
        load_manifest(path)


def test_archive_holding_a_file_and_a_folder_of_one_name_is_refused(built: Path) -> None:
    # Both members are real and sealed, so only the names tell: unpacking the second would
    # fail half-way, where the first stands as a file.
    archive = built / "package.tar"
    with tarfile.open(archive, "a") as tar:
        for name in ("tokenizer/x", "tokenizer/x/y"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"z"))
    manifest = load_manifest(built / MANIFEST_NAME)
    extra = [
        FileEntry(path=name, size=1, sha256=hashlib.sha256(b"z").hexdigest())
        for name in ("tokenizer/x", "tokenizer/x/y")
    ]
    data = manifest.model_dump(mode="json")
    data["archive"] = file_entry(archive, "package.tar").model_dump()
    data["archive_files"] += [e.model_dump() for e in extra]
    (built / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(PackageError) as err:
        verify_package(built)
    assert "archive_files: 'tokenizer/x' is a file, so 'tokenizer/x/y' cannot lie inside it" in (
        str(err.value)
    )


def test_weight_inside_the_archive_path_is_refused(built: Path) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["weight_files"].append({"path": "package.tar/shard", "size": 1, "sha256": "0" * 64})
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError) as err:
        load_manifest(path)
    assert "weight_files: 'package.tar' is a file, so 'package.tar/shard' cannot lie" in str(
        err.value
    )


@pytest.mark.parametrize("field", ["tokenizer", "weights"])
def test_manifest_naming_the_root_as_a_folder_is_refused(built: Path, field: str) -> None:
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    data[field] = "."
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError, match=rf"field {field}: .*path '\.' is the root itself"):
        load_manifest(path)


@pytest.mark.parametrize("quick", [[], ["--quick"]])
def test_weight_replaced_by_a_folder_is_one_error_line(built: Path, quick: list[str]) -> None:
    # A folder of the size the manifest says (the size check alone cannot tell).
    weight = built / "weights" / "model.safetensors"
    weight.unlink()
    weight.mkdir()
    path = built / MANIFEST_NAME
    data = json.loads(path.read_text())
    for entry in data["weight_files"]:
        if entry["path"] == "weights/model.safetensors":
            entry["size"] = weight.stat().st_size
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["package", "verify", *quick, str(built)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: weights/model.safetensors in "), lines


def test_exported_schema_is_current_and_validates_manifests(built: Path) -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == manifest_json_schema()
    schema = manifest_json_schema()
    data = json.loads((built / MANIFEST_NAME).read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert "format_version" in schema["required"]
    for field in ("archive", "format_version"):
        incomplete = {k: v for k, v in data.items() if k != field}
        with pytest.raises(jsonschema.ValidationError, match=f"'{field}' is a required property"):
            jsonschema.Draft202012Validator(schema).validate(incomplete)


def _tensor(name: str, data_type: str, optional: bool) -> TensorSpec:
    return TensorSpec(name=name, data_type=data_type, dims=[1], optional=optional)  # type: ignore[arg-type]


def _frontend_model() -> PythonModel:
    inputs = [_tensor(t.name, t.data_type, not t.required) for t in FRONTEND_INPUTS]
    outputs = [_tensor(t.name, t.data_type, False) for t in FRONTEND_OUTPUTS[:1]]
    return PythonModel(inputs=inputs, outputs=outputs)


def test_python_model_matching_the_frontend_passes() -> None:
    check_python_model(_frontend_model())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: m.inputs.pop(0), "input text_input (TYPE_STRING) is missing"),
        (
            lambda m: m.inputs.__setitem__(2, _tensor("sampling_parameters", "TYPE_INT32", True)),
            "input sampling_parameters is TYPE_INT32, the frontend uses TYPE_STRING",
        ),
        (
            lambda m: m.inputs.append(_tensor("temperature", "TYPE_FP32", False)),
            "input temperature is required but the frontend never sends it",
        ),
        (
            lambda m: m.inputs.__setitem__(1, _tensor("stream", "TYPE_BOOL", False)),
            "input stream must be optional",
        ),
        (
            lambda m: m.outputs.__setitem__(0, _tensor("text_output", "TYPE_FP32", False)),
            "output text_output is TYPE_FP32",
        ),
    ],
)
def test_python_model_mismatch_is_named(change, expected: str) -> None:  # type: ignore[no-untyped-def]
    model = _frontend_model()
    change(model)
    with pytest.raises(PackageError, match="python_model tensors do not match") as err:
        check_python_model(model)
    assert expected in str(err.value)


@pytest.mark.parametrize("dims", [[4, 4], [4], [1, 1], [-1, -1], [2]])
def test_python_model_input_dims_must_take_the_shape_the_frontend_sends(dims: list[int]) -> None:
    model = _frontend_model()
    model.inputs[0] = TensorSpec(name="text_input", data_type="TYPE_STRING", dims=dims)
    with pytest.raises(PackageError) as err:
        check_python_model(model)
    assert (
        f"input text_input declares dims {dims} but the frontend sends shape [1] "
        "(max_batch_size 0): declare dims [1] or [-1]"
    ) in str(err.value)


def test_build_refuses_python_model_input_dims_the_frontend_does_not_send(tmp_path: Path) -> None:
    inputs = [t.model_dump() for t in _frontend_model().inputs]
    inputs[0]["dims"] = [4, 4]
    source = make_source(
        tmp_path / "src",
        backend="python",
        python_model={
            "inputs": inputs,
            "outputs": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
        },
    )
    (source / "python").mkdir()
    (source / "python" / "model.py").write_text("class TritonPythonModel: ...\n")
    with pytest.raises(PackageError, match=r"input text_input declares dims \[4, 4\]"):
        build_package(source, tmp_path / "out")
    spec = yaml.safe_load((source / "package.yaml").read_text())
    spec["python_model"]["inputs"][0]["dims"] = [1]
    (source / "package.yaml").write_text(yaml.safe_dump(spec))
    assert build_package(source, tmp_path / "out").python_model is not None


def test_python_model_input_dims_may_be_variable_and_outputs_any_shape() -> None:
    model = _frontend_model()
    model.inputs[1] = TensorSpec(name="stream", data_type="TYPE_BOOL", dims=[-1], optional=True)
    model.outputs[0] = TensorSpec(name="text_output", data_type="TYPE_STRING", dims=[-1, 4])
    check_python_model(model)


def test_build_refuses_python_model_the_frontend_cannot_call(tmp_path: Path) -> None:
    source = make_source(
        tmp_path / "src",
        backend="python",
        python_model={
            "inputs": [{"name": "prompt", "data_type": "TYPE_STRING", "dims": [1]}],
            "outputs": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
        },
    )
    (source / "python").mkdir()
    (source / "python" / "model.py").write_text("class TritonPythonModel: ...\n")
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert "input prompt is required" in str(err.value)
    assert "input text_input (TYPE_STRING) is missing" in str(err.value)


def test_python_model_may_leave_out_inputs_of_other_features() -> None:
    model = _frontend_model()
    model.inputs[:] = [t for t in model.inputs if t.name not in ("embedding_request",)]
    model.inputs[:] = [t for t in model.inputs if t.name != "return_cumulative_logprob"]
    check_python_model(model)
    model.inputs.append(_tensor("embedding_request", "TYPE_INT32", True))
    with pytest.raises(PackageError, match="input embedding_request is TYPE_INT32"):
        check_python_model(model)
