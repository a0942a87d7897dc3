"""``package build`` and ``verify`` refuse a plugin wheel vLLM would never load (no entry point
in ``vllm.general_plugins`` / ``vllm.logits_processors``) unless another plugin requires it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runtime.package import PackageError, build_package, verify_package
from tests.runtime.wheelmaker import make_source, make_wheel

GENERAL = {"vllm.general_plugins": {"needs_lib": "needs_lib:register"}}
TYPO = "plugins/typo_plugin-1.0-py3-none-any.whl"


def _source(tmp_path: Path, *wheels: Path) -> Path:
    """The toy source tree's spec with ``wheels`` (made in its plugins/) added as plugins."""
    source = tmp_path / "src"
    spec = yaml.safe_load((source / "package.yaml").read_text())
    spec["plugins"] += [f"plugins/{w.name}" for w in wheels]
    (source / "package.yaml").write_text(yaml.safe_dump(spec))
    return source


def _typo_source(tmp_path: Path) -> Path:
    plugins = make_source(tmp_path / "src") / "plugins"
    wheel = make_wheel(
        plugins,
        "typo-plugin",
        entry_points={"vllm.logits_processor": {"typo": "typo_plugin:Processor"}},
    )
    return _source(tmp_path, wheel)


def test_build_refuses_an_entry_point_under_a_misspelled_group(tmp_path: Path) -> None:
    with pytest.raises(PackageError) as err:
        build_package(_typo_source(tmp_path), tmp_path / "out")
    message = str(err.value)
    assert f"plugin wheel {TYPO} (typo-plugin) registers no entry point in" in message
    assert "[vllm.logits_processor] looks like a misspelling of vllm.logits_processors" in message
    assert "and no other plugin wheel of the package requires it" in message
    assert "rename [vllm.logits_processor] to [vllm.logits_processors]" in message
    assert not (tmp_path / "out").exists()


def test_build_refuses_a_plugin_without_entry_points(tmp_path: Path) -> None:
    plugins = make_source(tmp_path / "src") / "plugins"
    source = _source(tmp_path, make_wheel(plugins, "bare-lib"))
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    message = str(err.value)
    assert "plugin wheel plugins/bare_lib-1.0-py3-none-any.whl (bare-lib) registers no" in message
    assert "it declares none" in message
    assert "declare the plugin's entry point under [vllm.general_plugins] or" in message


def test_a_dependency_wheel_another_plugin_requires_needs_no_entry_point(tmp_path: Path) -> None:
    # The install is offline, so a plugin's own dependencies travel as wheels in the package.
    plugins = make_source(tmp_path / "src") / "plugins"
    library = make_wheel(plugins, "Helper.Lib", version="2.0", package="helper_lib")
    plugin = make_wheel(plugins, "needs-lib", requires=("helper-lib>=2",), entry_points=GENERAL)
    manifest = build_package(_source(tmp_path, library, plugin), tmp_path / "out")
    assert [p.distribution for p in manifest.plugins] == ["toy-plugin", "Helper.Lib", "needs-lib"]
    verify_package(tmp_path / "out")


def test_a_requirement_whose_marker_fails_in_the_image_exempts_nothing(tmp_path: Path) -> None:
    # The default pair's image runs Python 3.12: there needs-lib does not require helper-lib,
    # whatever Python builds the package.
    plugins = make_source(tmp_path / "src") / "plugins"
    library = make_wheel(plugins, "helper-lib", version="2.0")
    plugin = make_wheel(
        plugins,
        "needs-lib",
        requires=('helper-lib>=2; python_version < "3.12"',),
        entry_points=GENERAL,
    )
    with pytest.raises(PackageError, match=r"helper_lib-2\.0-py3-none-any\.whl \(helper-lib\)"):
        build_package(_source(tmp_path, library, plugin), tmp_path / "out")


def test_a_plugin_requiring_itself_is_not_exempt(tmp_path: Path) -> None:
    plugins = make_source(tmp_path / "src") / "plugins"
    wheel = make_wheel(plugins, "loop-lib", requires=("loop-lib",))
    with pytest.raises(PackageError, match=r"\(loop-lib\) registers no entry point"):
        build_package(_source(tmp_path, wheel), tmp_path / "out")


def test_verify_refuses_an_entry_point_under_a_misspelled_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        # Packaged as an older builder without the check would have.
        patch.setattr("runtime.package.build.check_plugin_entry_points", lambda *a: None)
        build_package(_typo_source(tmp_path), tmp_path / "out")
    with pytest.raises(PackageError) as err:
        verify_package(tmp_path / "out")
    assert "rename [vllm.logits_processor] to [vllm.logits_processors]" in str(err.value)
