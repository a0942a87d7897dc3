"""``package build`` and ``verify`` refuse a plugin wheel the image's pip would not install: one
tagged for another platform or Python, or whose file name disagrees with its METADATA."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest
import yaml
from packaging.tags import sys_tags

from runtime.compat import load_matrix
from runtime.package import PackageError, build_package, verify_package
from runtime.package.wheels import ImageEnvironment
from tests.runtime.wheelmaker import make_source

TOY = "toy_plugin-1.0-py3-none-any.whl"
#: The default pair's image Python, and its CPython tag.
PYTHON = load_matrix().default.python
CP = "cp" + PYTHON.replace(".", "")


def _renamed(tmp_path: Path, name: str) -> Path:
    """The toy source tree with its plugin wheel renamed ``name`` (contents unchanged)."""
    source = make_source(tmp_path / "src")
    shutil.move(source / "plugins" / TOY, source / "plugins" / name)
    spec = yaml.safe_load((source / "package.yaml").read_text())
    spec["plugins"] = [f"plugins/{name}"]
    (source / "package.yaml").write_text(yaml.safe_dump(spec))
    return source


# (the wheel's file name, what the refusal must say)
TAGS = [
    pytest.param(
        f"toy_plugin-1.0-{CP}-{CP}-macosx_14_0_arm64.whl",
        f"is built for {CP}-{CP}-macosx_14_0_arm64, and the image (CPython {PYTHON}, Linux "
        "x86_64, glibc 2.39) installs none of these; rebuild it as a pure-Python wheel "
        f"(py3-none-any) or for {CP} manylinux x86_64",
        id="macos",
    ),
    pytest.param(
        "toy_plugin-1.0-cp27-cp27mu-manylinux1_x86_64.whl",
        "is built for cp27-cp27mu-manylinux1_x86_64",
        id="another-python",
    ),
    pytest.param(
        f"toy_plugin-1.0-{CP}-{CP}-manylinux_2_17_aarch64.whl",
        f"is built for {CP}-{CP}-manylinux_2_17_aarch64",
        id="another-cpu",
    ),
    pytest.param(
        f"toy_plugin-1.0-{CP}-{CP}-manylinux_2_40_x86_64.whl",
        f"is built for {CP}-{CP}-manylinux_2_40_x86_64",
        id="newer-glibc",
    ),
    pytest.param(
        f"toy_plugin-1.0-{CP}-{CP}-musllinux_1_2_x86_64.whl",
        f"is built for {CP}-{CP}-musllinux_1_2_x86_64",
        id="musl",
    ),
]
NAMES = [
    pytest.param(
        "other_plugin-1.0-py3-none-any.whl",
        "its file name says other-plugin 1.0, its METADATA toy-plugin 1.0, and pip refuses",
        id="another-name",
    ),
    pytest.param(
        "toy_plugin-2.0-py3-none-any.whl",
        "its file name says toy-plugin 2.0, its METADATA toy-plugin 1.0",
        id="another-version",
    ),
    pytest.param(
        "toy_plugin.whl",
        "toy_plugin.whl is not a wheel's file name",
        id="not-a-wheel-name",
    ),
]


@pytest.mark.parametrize(("name", "message"), TAGS + NAMES)
def test_build_refuses_a_wheel_the_image_cannot_install(
    tmp_path: Path, name: str, message: str
) -> None:
    with pytest.raises(PackageError) as err:
        build_package(_renamed(tmp_path, name), tmp_path / "out")
    assert f"plugin wheel plugins/{name}" in str(err.value)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "message"), TAGS)
def test_verify_refuses_a_wheel_the_image_cannot_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, message: str
) -> None:
    with monkeypatch.context() as patch:
        # Packaged as a builder without the check would have.
        patch.setattr("runtime.package.wheels.check_installable", lambda *a: None)
        build_package(_renamed(tmp_path, name), tmp_path / "out")
    with pytest.raises(PackageError) as err:
        verify_package(tmp_path / "out")
    assert message in str(err.value)


@pytest.mark.parametrize(
    "tag",
    [
        "py3-none-any",
        "py2.py3-none-any",
        f"{CP}-{CP}-manylinux_2_17_x86_64.manylinux2014_x86_64",
        f"{CP}-{CP}-manylinux_2_39_x86_64",
        "cp39-abi3-manylinux1_x86_64",
        f"{CP}-{CP}-linux_x86_64",
    ],
)
def test_wheels_the_image_installs_pass(tmp_path: Path, tag: str) -> None:
    build_package(_renamed(tmp_path, f"toy_plugin-1.0-{tag}.whl"), tmp_path / "out")
    assert verify_package(tmp_path / "out").plugins[0].distribution == "toy-plugin"


def test_image_tags_are_what_pip_would_accept_here() -> None:
    # Built for this interpreter and glibc, the image's tags are exactly packaging's own.
    glibc = platform.libc_ver()[1].split(".")
    here = ImageEnvironment(
        python=platform.python_version().rsplit(".", 1)[0],
        machine=platform.machine(),
        glibc=(int(glibc[0]), int(glibc[1])),
    )
    assert here.tags() == frozenset(sys_tags())
