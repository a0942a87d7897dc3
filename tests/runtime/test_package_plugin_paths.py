"""``package build``, ``verify`` and the entrypoint's stage 3 judge a plugin wheel's files where
pip writes them: a member name pip normalises (``x/../torch/__init__.py`` lands as
``torch/__init__.py``) and the data, scripts and headers of a ``*.data/`` folder (installed at
the top of the plugin folder or under the image's prefix) are refused, and the purelib and
platlib schemes are judged as site-packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime.entrypoint import ExitCode
from runtime.package import PackageError, build_package, verify_package
from runtime.package.plugin_checks import check_plugin_files
from runtime.package.shadowing import ImageNames
from runtime.package.wheels import read_wheel
from tests.runtime.pod import Pod
from tests.runtime.test_entrypoint_failures import failure_line
from tests.runtime.wheelmaker import make_wheel, source_with_sneaky_plugin

GENERAL = {"vllm.general_plugins": {"sneaky": "sneaky:register"}}
WHEEL = "plugins/sneaky-1.0-py3-none-any.whl"
SCHEME_FIX = "a vLLM plugin needs none: vLLM loads it through its entry points"

# (files the plugin wheel ships besides its own package, what the refusal must say)
REFUSED = [
    pytest.param(
        {"sneaky/../torch/__init__.py": b"SHADOWED = True\n"},
        "has a member named 'sneaky/../torch/__init__.py' (pip would write it as "
        "torch/__init__.py), not a plain relative path",
        id="dotdot-over-torch",
    ),
    pytest.param(
        {"./numpy/__init__.py": b"SHADOWED = True\n"},
        "has a member named './numpy/__init__.py' (pip would write it as numpy/__init__.py)",
        id="dot-over-numpy",
    ),
    pytest.param(
        {"sneaky-1.0.dist-info/../vllm/__init__.py": b""},
        "(pip would write it as vllm/__init__.py)",
        id="dotdot-out-of-dist-info",
    ),
    pytest.param(
        {"sneaky//twice.py": b""}, "'sneaky//twice.py' (pip would write it as", id="empty"
    ),
    pytest.param({"/etc/evil.py": b""}, "has a member named '/etc/evil.py', not a plain", id="abs"),
    pytest.param(
        {"sneaky\\evil.py": b""}, "named 'sneaky\\\\evil.py', not a plain", id="backslash"
    ),
    pytest.param(
        {"sneaky-1.0.data/data/vllm/__init__.py": b""},
        "ships sneaky-1.0.data/data/vllm/__init__.py, in the wheel's sneaky-1.0.data/data/ folder",
        id="data-at-the-top-of-the-plugin-folder",
    ),
    pytest.param(
        {"sneaky-1.0.data/data/lib/python3.12/site-packages/numpy/x.py": b""},
        "in the wheel's sneaky-1.0.data/data/ folder: pip installs only purelib and platlib",
        id="data-into-site-packages",
    ),
    pytest.param(
        {"sneaky-1.0.data/data/cuda/lib64/libcudart.so.12": b""},
        "under the image's prefix (bin/, include/, anything below it)",
        id="data-under-the-prefix",
    ),
    pytest.param(
        {"sneaky-1.0.data/scripts/pip3.12": b"#!/bin/sh\n"},
        "ships sneaky-1.0.data/scripts/pip3.12, in the wheel's sneaky-1.0.data/scripts/ folder",
        id="scripts",
    ),
    pytest.param(
        {"sneaky-1.0.data/headers/Python.h": b""},
        "in the wheel's sneaky-1.0.data/headers/ folder",
        id="headers",
    ),
    pytest.param(
        {"other-2.0.data/scripts/vllm": b""},  # pip takes any *.data folder for the data folder
        "in the wheel's other-2.0.data/scripts/ folder",
        id="another-data-folder",
    ),
    pytest.param(
        {"sneaky-1.0.data/platlib/torch/_C.so": b""},
        "ships sneaky-1.0.data/platlib/torch/_C.so (installed as torch/_C.so): it would shadow "
        "torch",
        id="platlib",
    ),
    pytest.param(
        {"other-2.0.data/purelib/numpy/__init__.py": b""},
        "(installed as numpy/__init__.py): it would shadow numpy",
        id="purelib-of-another-data-folder",
    ),
]


@pytest.mark.parametrize(("files", "message"), REFUSED)
def test_build_refuses_files_pip_would_write_elsewhere(
    tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    with pytest.raises(PackageError) as err:
        build_package(source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out")
    assert f"plugin wheel {WHEEL} " in str(err.value)
    assert message in str(err.value)
    assert "rebuild the wheel" in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("files", "message"), REFUSED)
def test_verify_refuses_files_pip_would_write_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes], message: str
) -> None:
    with monkeypatch.context() as patch:
        # Packaged as a builder without the check would have.
        patch.setattr("runtime.package.build.check_plugin_files", lambda *a: None)
        build_package(source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out")
    with pytest.raises(PackageError) as err:
        verify_package(tmp_path / "out")
    assert message in str(err.value)


@pytest.fixture(scope="module")
def image() -> ImageNames:
    return ImageNames.scan(sys.path, Path("/nonexistent"))


@pytest.mark.parametrize(("files", "message"), REFUSED)
def test_stage_3_check_refuses_files_pip_would_write_elsewhere(
    tmp_path: Path, image: ImageNames, files: dict[str, bytes], message: str
) -> None:
    # What stage 3 runs on each wheel before pip, against the installed distributions.
    wheel = make_wheel(tmp_path, "sneaky", entry_points=GENERAL, files=files)
    with pytest.raises(PackageError) as raised:
        check_plugin_files(read_wheel(wheel, WHEEL), WHEEL, image, {"vllm", "torch"})
    assert message in str(raised.value)


def test_scheme_refusal_says_a_plugin_needs_no_data(tmp_path: Path) -> None:
    files = {"sneaky-1.0.data/scripts/sneaky": b"#!python\n"}
    with pytest.raises(PackageError, match=SCHEME_FIX):
        build_package(source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out")


@pytest.mark.parametrize(
    ("files", "landed"),
    [
        ({"sneaky/../torch/__init__.py": b"SHADOWED = True\n"}, "torch"),
        ({"sneaky-1.0.data/data/numpy/__init__.py": b"SHADOWED = True\n"}, "numpy"),
    ],
    ids=["dotdot", "data"],
)
def test_pod_refuses_the_wheel_before_pip_runs(
    tmp_path: Path, files: dict[str, bytes], landed: str
) -> None:
    wheel = make_wheel(tmp_path / "wheels", "sneaky", entry_points=GENERAL, files=files)
    pod = Pod.create(tmp_path)
    pod.add_plugin(wheel)
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    assert "plugin wheel plugins/sneaky-1.0-py3-none-any.whl " in failure_line(err)
    assert not (pod.root / "plugins" / landed).exists()


def test_plain_names_and_site_packages_schemes_pass(tmp_path: Path) -> None:
    files = {
        "sneaky-1.0.data/purelib/sneaky_extra/__init__.py": b"",
        "sneaky-1.0.data/platlib/sneaky_native.so": b"",
        "sneaky_data/": b"",  # a folder entry
        "sneaky_data/model.json": b"{}",
    }
    build_package(source_with_sneaky_plugin(tmp_path / "src", files), tmp_path / "out")
    assert verify_package(tmp_path / "out").plugins[1].distribution == "sneaky"


@pytest.mark.parametrize("group", ["console_scripts", "gui_scripts"])
def test_a_plugin_that_registers_commands_is_refused(
    tmp_path: Path, image: ImageNames, group: str
) -> None:
    """pip writes these entry points as commands into bin/: into the image's prefix (no plugin
    folder), one named vllm would replace the image's."""
    entry_points = {**GENERAL, group: {"vllm": "sneaky:main"}}
    wheel = make_wheel(tmp_path, "sneaky", entry_points=entry_points, files={"sneaky.py": b""})
    with pytest.raises(PackageError) as raised:
        check_plugin_files(read_wheel(wheel, wheel.name), wheel.name, image, {"vllm"})
    assert f"registers [{group}] entry points" in str(raised.value)
