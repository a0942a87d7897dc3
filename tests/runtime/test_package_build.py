"""``package build`` writes a checked version folder and refuses every unsafe source tree."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from runtime.package import MANIFEST_NAME, PackageError, build_package, load_manifest
from runtime.package.wheels import ImageEnvironment, WheelInfo, check_against_pins
from tests.runtime.wheelmaker import make_source, make_toy_plugin, make_wheel, write_catalog


def test_build_writes_archive_weights_and_manifest(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    out = tmp_path / "out"
    manifest = build_package(source, out)
    assert load_manifest(out / MANIFEST_NAME) == manifest
    assert (manifest.model_id, manifest.model_version, manifest.triton) == ("toy", "v1", "26.08")
    with tarfile.open(out / "package.tar") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(e.path for e in manifest.archive_files)
    assert "tokenizer/tokenizer.json" in names and "catalogs/titles.jsonl" in names
    assert {e.path for e in manifest.weight_files} == {
        "weights/model.safetensors",
        "weights/config.json",
    }
    (plugin,) = manifest.plugins
    assert (plugin.distribution, plugin.version) == ("toy-plugin", "1.0")
    assert plugin.entry_points == {"vllm.logits_processors": ["toy"]}
    assert manifest.archive.size == (out / "package.tar").stat().st_size


def test_archive_is_reproducible(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    first = build_package(source, tmp_path / "a")
    os.utime(source / "tokenizer" / "tokenizer.json", (1, 1))
    second = build_package(source, tmp_path / "b")
    assert first.archive.sha256 == second.archive.sha256


def _spec(source: Path) -> dict:
    return yaml.safe_load((source / "package.yaml").read_text())


def _write_spec(source: Path, spec: dict) -> None:
    (source / "package.yaml").write_text(yaml.safe_dump(spec))


def test_plugin_requiring_another_vllm_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    make_wheel(source / "plugins", "upgrader", requires=("vllm>=0.30",))
    spec = _spec(source)
    spec["plugins"].append("plugins/upgrader-1.0-py3-none-any.whl")
    _write_spec(source, spec)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    message = str(err.value)
    assert "plugins/upgrader-1.0-py3-none-any.whl" in message
    assert "vllm>=0.30" in message and "vllm==0.27.1" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("requirement", "pinned"),
    [("torch<2.13", "torch==2.13.0"), ("torchvision==0.29.0", "torchvision==0.28.0")],
)
def test_plugin_moving_other_pins_is_refused(tmp_path: Path, requirement: str, pinned: str) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", requirement)
    with pytest.raises(PackageError, match=pinned):
        build_package(source, tmp_path / "out")


def test_extra_constraints_file_pins_backend_dependencies(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# the image's freeze\nnumpy==1.26.4\n")
    make_toy_plugin(source / "plugins", "numpy>=2")
    with pytest.raises(PackageError, match=r"numpy==1\.26\.4"):
        build_package(source, tmp_path / "out", constraints=constraints)


def test_plugin_requirement_behind_an_unused_extra_is_ignored(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", 'vllm>=0.30; extra == "dev"')
    assert build_package(source, tmp_path / "out").plugins[0].distribution == "toy-plugin"


@pytest.mark.parametrize(
    ("asks", "refused"),
    [
        ("fast-lib[speed]", True),
        ("fast-lib", False),  # without the extra, what it adds is not installed
    ],
)
def test_what_an_extra_of_a_shipped_wheel_adds_is_checked_against_the_pins(
    tmp_path: Path, asks: str, refused: bool
) -> None:
    # pip installs plugins with --no-deps, so nothing else would check the extra's requirements.
    source = make_source(tmp_path / "src")
    make_wheel(source / "plugins", "fast-lib", requires=('torch==1.0; extra == "speed"',))
    make_toy_plugin(source / "plugins", asks)
    spec = _spec(source)
    spec["plugins"].append("plugins/fast_lib-1.0-py3-none-any.whl")
    _write_spec(source, spec)
    if not refused:
        assert len(build_package(source, tmp_path / "out").plugins) == 2
        return
    with pytest.raises(PackageError) as raised:
        build_package(source, tmp_path / "out")
    assert str(raised.value).startswith(
        "plugin wheel plugins/toy_plugin-1.0-py3-none-any.whl requires 'fast-lib[speed]', and "
        "fast-lib[speed] requires 'torch==1.0; extra == \"speed\"' but the image pins "
        "torch==2.13.0; rebuild the plugin against torch==2.13.0"
    ), raised.value


def test_plugin_markers_are_evaluated_for_the_image_python(tmp_path: Path) -> None:
    # The default pair's image runs Python 3.12; the tests run on whatever built the venv.
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", 'vllm>=0.30; python_version >= "3.12"')
    with pytest.raises(PackageError, match=r"requires 'vllm>=0\.30; python_version"):
        build_package(source, tmp_path / "out")


@pytest.mark.parametrize(
    "marker",
    ['python_version < "3.12"', 'sys_platform == "darwin"', 'platform_machine == "arm64"'],
)
def test_plugin_requirement_for_another_platform_is_ignored(tmp_path: Path, marker: str) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", f"vllm>=0.30; {marker}")
    assert build_package(source, tmp_path / "out").plugins[0].distribution == "toy-plugin"


def test_image_environment_markers_describe_the_image() -> None:
    markers = ImageEnvironment(python="3.10").markers()
    assert markers["python_version"] == "3.10" and markers["python_full_version"] == "3.10.0"
    info = WheelInfo("p", "1", ('vllm>=0.30; python_version < "3.11"',), {})
    with pytest.raises(PackageError, match=r"vllm==0\.27\.1"):
        check_against_pins(info, "p.whl", {"vllm": Version("0.27.1")}, ImageEnvironment("3.10"))
    check_against_pins(info, "p.whl", {"vllm": Version("0.27.1")}, ImageEnvironment("3.12"))


def test_plugin_that_is_a_pinned_distribution_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    make_wheel(source / "plugins", "vllm", version="0.30.0")
    spec = _spec(source)
    spec["plugins"] = ["plugins/vllm-0.30.0-py3-none-any.whl"]
    _write_spec(source, spec)
    with pytest.raises(PackageError, match=r"vllm-0\.30\.0-py3-none-any\.whl is vllm 0\.30\.0"):
        build_package(source, tmp_path / "out")


def test_missing_tokenizer_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    (source / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(PackageError, match=r"tokenizer: tokenizer/ is missing"):
        build_package(source, tmp_path / "out")


def test_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    secret = tmp_path / "secret.txt"
    secret.write_text("key")
    (source / "tokenizer" / "special_tokens_map.json").symlink_to(secret)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert "tokenizer/special_tokens_map.json is a symlink out of the package root" in str(
        err.value
    )


def test_symlink_inside_the_root_is_packaged_as_a_file(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    (source / "tokenizer" / "vocab.json").symlink_to(source / "catalogs" / "titles.jsonl")
    manifest = build_package(source, tmp_path / "out")
    assert "tokenizer/vocab.json" in {e.path for e in manifest.archive_files}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("tokenizer", "/etc/tokenizer", "is absolute"),
        ("tokenizer", "../tokenizer", "stay inside the package root"),
        ("weights", "weights/../../x", "stay inside the package root"),
    ],
)
def test_paths_outside_the_root_are_refused(
    tmp_path: Path, field: str, value: str, expected: str
) -> None:
    source = make_source(tmp_path / "src")
    spec = _spec(source)
    spec[field] = value
    _write_spec(source, spec)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert field in str(err.value) and expected in str(err.value) and value in str(err.value)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (".", "weights: '.' is the whole source tree"),
        ("package.tar", "weights: package.tar collides with the version folder's own package.tar"),
        ("manifest.json", "weights: manifest.json collides with the version folder's own manif"),
        ("package.tar/shards", "weights: package.tar/shards collides with the version folder"),
    ],
)
def test_weights_path_must_not_be_the_root_or_a_package_file(
    tmp_path: Path, weights: str, expected: str
) -> None:
    source = make_source(tmp_path / "src")
    target = source / weights
    if weights != ".":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"\x00" * 64)
    spec = _spec(source)
    spec["weights"] = weights
    _write_spec(source, spec)
    with pytest.raises(PackageError, match=re.escape(expected)):
        build_package(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_absolute_plugin_path_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    spec = _spec(source)
    spec["plugins"] = [str(source / "plugins" / "toy_plugin-1.0-py3-none-any.whl")]
    _write_spec(source, spec)
    with pytest.raises(PackageError, match=r"plugins\.0: path .* is absolute"):
        build_package(source, tmp_path / "out")


def test_duplicate_entries_are_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    spec = _spec(source)
    spec["include"] = ["catalogs"]
    _write_spec(source, spec)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert "duplicate entry catalogs/titles.jsonl (from catalogs.0 and include.0)" in str(err.value)


def test_duplicate_catalog_names_are_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    write_catalog(source / "catalogs" / "other.jsonl", {"o1": "fox"})
    spec = _spec(source)
    spec["catalogs"].append({"name": "titles", "path": "catalogs/other.jsonl"})
    _write_spec(source, spec)
    with pytest.raises(PackageError, match="duplicate catalog name: titles"):
        build_package(source, tmp_path / "out")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[]\n", 'expected an object with keys "id" and "text"'),
        ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "duplicate id 'a'"),
        ("", "the catalog has no items"),
        ('{"id": "a", "text": "x"\n', "not valid JSON"),
    ],
)
def test_catalog_the_engine_cannot_read_is_refused(
    tmp_path: Path, content: str, expected: str
) -> None:
    source = make_source(tmp_path / "src")
    (source / "catalogs" / "titles.jsonl").write_text(content)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    message = str(err.value)
    assert "catalogs.0: catalog 'titles' (catalogs/titles.jsonl)" in message
    assert expected in message
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_catalog_folder_is_refused(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    spec = _spec(source)
    spec["catalogs"] = [{"name": "titles", "path": "catalogs"}]
    _write_spec(source, spec)
    with pytest.raises(PackageError, match=r"catalogs\.0: catalogs must be one file"):
        build_package(source, tmp_path / "out")


def test_embedded_package_must_set_max_model_len(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", serving_mode="embedded", engine_args={})
    with pytest.raises(PackageError, match="serving_mode embedded needs max_model_len"):
        build_package(source, tmp_path / "out")
    standalone = make_source(tmp_path / "plain", engine_args={})
    assert "max_model_len" not in build_package(standalone, tmp_path / "out2").engine_args


def test_engine_args_cannot_set_the_model_path(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", engine_args={"model": "/tmp/other"})
    with pytest.raises(PackageError, match=r"field engine_args: .*must not set model"):
        build_package(source, tmp_path / "out")


def test_engine_args_cannot_turn_on_speculative_decoding(tmp_path: Path) -> None:
    draft = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    source = make_source(tmp_path / "src", engine_args=draft)
    with pytest.raises(PackageError, match=r"field engine_args: .*speculative_config"):
        build_package(source, tmp_path / "out")


def test_unknown_spec_field_is_named(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", weigths="weights")
    with pytest.raises(PackageError, match=r"package\.yaml: field weigths"):
        build_package(source, tmp_path / "out")


def test_output_folder_must_be_empty(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale").write_text("x")
    with pytest.raises(PackageError, match="not empty"):
        build_package(source, tmp_path / "out")


def test_manifest_json_is_stable_and_versioned(tmp_path: Path) -> None:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["format_version"] == 1
    assert list(data) == sorted(data)
