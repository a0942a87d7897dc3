"""``package build`` and ``verify`` refuse plugin wheels whose files would shadow what the image
has: a ``.pth`` file, another distribution's metadata, a package of a pinned distribution or of
one of vLLM's requirements (by import name, not distribution name)."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from runtime.compat import load_matrix
from runtime.package import PackageError, build_package, verify_package
from runtime.package.build import image_pins
from runtime.package.plugin_checks import IMPORT_NAMES, import_keys
from runtime.package.shadowing import ImageNames
from tests.runtime.wheelmaker import source_with_sneaky_plugin

GENERAL = {"vllm.general_plugins": {"sneaky": "sneaky:register"}}
WHEEL = "plugins/sneaky-1.0-py3-none-any.whl"

# (files the plugin wheel ships, a constraints file's lines, what the refusal must say)
REFUSED = [
    pytest.param(
        {"zzz-sneaky.pth": b"import os\n"},
        "",
        f"plugin wheel {WHEEL} ships zzz-sneaky.pth, a .pth file",
        id="pth",
    ),
    pytest.param(
        {"sneaky-1.0.data/purelib/evil.pth": b"import os\n"},
        "",
        "ships sneaky-1.0.data/purelib/evil.pth, a .pth file",
        id="pth-in-purelib",
    ),
    pytest.param(
        {"vllm-0.27.1.dist-info/RECORD": b""},
        "",
        f"plugin wheel {WHEEL} ships vllm-0.27.1.dist-info/RECORD, metadata of another "
        "distribution (vllm-0.27.1.dist-info)",
        id="foreign-metadata",
    ),
    pytest.param(
        {"vllm/__init__.py": b"SHADOWED = True\n"},
        "",
        f"plugin wheel {WHEEL} ships vllm/__init__.py: it would shadow vllm, which the image "
        "has from vllm (pinned); drop vllm from the plugin project",
        id="vllm",
    ),
    pytest.param(
        {"torch.py": b""},
        "",
        "ships torch.py: it would shadow torch, which the image has from torch (pinned)",
        id="torch-module",
    ),
    pytest.param(
        {"torchvision/__init__.py": b""}, "", "from torchvision (pinned)", id="torchvision"
    ),
    pytest.param(
        {"their_lib/__init__.py": b""},
        "their-lib==1.0\n",
        "ships their_lib/__init__.py: it would shadow their_lib, which the image has from "
        "their-lib (pinned)",
        id="constraints-file-pin",
    ),
    pytest.param(
        {"regex/__init__.py": b""},  # vLLM requires regex with no version bound
        "",
        "it would shadow regex, which the image has from regex;",
        id="unbounded-vllm-requirement",
    ),
    pytest.param(
        {"yaml/__init__.py": b""},
        "",
        "it would shadow yaml, which the image has from pyyaml",
        id="pyyaml",
    ),
    pytest.param(
        {"PIL/Image.py": b""}, "", "shadow PIL, which the image has from pillow", id="pil"
    ),
    pytest.param({"cv2/__init__.py": b""}, "", "from opencv-python-headless", id="opencv"),
    pytest.param(
        {"google/protobuf/evil.py": b""},
        "",
        "it would shadow google.protobuf, which the image has from protobuf",
        id="protobuf-portion",
    ),
    pytest.param(
        {"sneaky-1.0.data/platlib/numpy/x.py": b""},
        "",
        "ships sneaky-1.0.data/platlib/numpy/x.py (installed as numpy/x.py): it would shadow numpy",
        id="platlib",
    ),
]


def _constraints(tmp_path: Path, lines: str) -> Path | None:
    if not lines:
        return None
    path = tmp_path / "constraints.txt"
    path.write_text(lines)
    return path


@pytest.mark.parametrize(("files", "constraints", "message"), REFUSED)
def test_build_refuses_a_plugin_that_would_shadow_the_image(
    tmp_path: Path, files: dict[str, bytes], constraints: str, message: str
) -> None:
    with pytest.raises(PackageError) as err:
        build_package(
            source_with_sneaky_plugin(tmp_path / "src", files),
            tmp_path / "out",
            constraints=_constraints(tmp_path, constraints),
        )
    assert message in str(err.value)
    assert "rebuild the wheel" in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("files", "constraints", "message"), REFUSED)
def test_verify_refuses_a_plugin_that_would_shadow_the_image(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, bytes],
    constraints: str,
    message: str,
) -> None:
    pins = _constraints(tmp_path, constraints)
    with monkeypatch.context() as patch:
        # Packaged as an older builder without the check would have.
        patch.setattr("runtime.package.build.check_plugin_files", lambda *a: None)
        build_package(
            source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out", constraints=pins
        )
    with pytest.raises(PackageError) as err:
        verify_package(tmp_path / "out", constraints=pins)
    assert message in str(err.value)


def test_own_packages_and_namespace_portions_pass(tmp_path: Path) -> None:
    # Scripts are refused (test_package_plugin_paths): pip writes them over the image's bin/.
    files = {
        "google/sneaky_ext/__init__.py": b"",  # a new portion of protobuf's google namespace
        "sneaky_data/model.json": b"{}",
    }
    build_package(source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out")
    assert verify_package(tmp_path / "out").plugins[1].distribution == "sneaky"


def test_import_names_agree_with_the_installed_distributions() -> None:
    # The dev setup installs many of vLLM's requirements: what their RECORD files say must be
    # what packaging assumes, both for the table and for the '-' -> '_' rule.
    known: set[str] = set()
    for pair in load_matrix().pairs:
        known |= image_pins(pair.triton, None).distributions
    assert set(IMPORT_NAMES) <= known, "a table entry that is neither pinned nor required"
    installed = ImageNames.scan(sys.path, Path("/nonexistent"))
    present = {canonicalize_name(d.metadata["Name"] or "") for d in md.distributions()}
    missing = [
        (name, key)
        for name in sorted(known & present)
        for key in import_keys(name)
        if name not in installed.owners.get(key, set())
    ]
    assert missing == [], "distributions that do not install these import names"
    assert len(known & present) > 20
