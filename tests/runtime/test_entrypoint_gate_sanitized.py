"""The relay tests rerun against an AddressSanitizer + UndefinedBehaviorSanitizer build of the
gate's native relay (``LLM_SERVING_SANITIZE=ON``, target ``_relay`` only, in
``build/sanitize-relay/``, incremental after the first build); a child Python with libasan
preloaded imports it in place of the regular module. Leak detection is off because CPython
keeps objects alive at exit by design."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "sanitize-relay"
TESTS = ["tests/runtime/test_entrypoint_gate_relay.py", "tests/runtime/test_entrypoint_gate.py"]
# Puts the sanitized module under the regular name before the gate imports it.
RUNNER = """
import importlib.util, sys
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("runtime.entrypoint._relay", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["runtime.entrypoint._relay"] = module
import runtime.entrypoint
runtime.entrypoint._relay = module
from runtime.entrypoint import gate
assert gate._relay.__file__ == path, gate._relay.__file__
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]]))
"""


def _cmake() -> str:
    local = Path(sys.executable).parent / "cmake"
    found = str(local) if local.exists() else shutil.which("cmake")
    assert found, "cmake is missing: it comes with the dev extras (pip install -e '.[dev]')"
    return found


def _compiler_runtime(name: str) -> str:
    out = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True)
    path = out.stdout.strip()
    assert os.path.isabs(path), f"g++ does not know {name}: {out.stderr}"
    return path


def _build() -> Path:
    cmake = _cmake()
    configure = subprocess.run(
        [
            cmake,
            "-S",
            str(ROOT),
            "-B",
            str(BUILD),
            "-DLLM_SERVING_SANITIZE=ON",
            "-DCMAKE_BUILD_TYPE=Debug",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DSKBUILD_PROJECT_VERSION=0.0.0+sanitize",
        ],
        capture_output=True,
        text=True,
    )
    assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    build = subprocess.run(
        [cmake, "--build", str(BUILD), "--target", "_relay", "--parallel", "2"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    (module,) = BUILD.glob("csrc/relay/_relay*.so")
    return module


@pytest.mark.sanitize
@pytest.mark.timeout(900)
def test_relay_tests_pass_under_asan_and_ubsan() -> None:
    module = _build()
    env = {
        **os.environ,
        "LD_PRELOAD": f"{_compiler_runtime('libasan.so')} {_compiler_runtime('libstdc++.so')}",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
    }
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, str(module), *TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    report = run.stdout[-6000:] + run.stderr[-6000:]
    assert run.returncode == 0, report
    assert " passed" in run.stdout and "failed" not in run.stdout, report
    assert "AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
