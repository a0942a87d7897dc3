"""Native extensions rebuilt with AddressSanitizer + UndefinedBehaviorSanitizer, and a child
Python (libasan preloaded) that runs chosen test files against them.

Targets are built with CMake (``LLM_SERVING_SANITIZE=ON``, Debug: -O0 compiles 3x faster and the
tests are small) into ``build/sanitize/``, incremental after the first build. The child imports
the sanitized module under its regular name before anything imports the package. Leak detection
is off because CPython keeps objects alive at exit by design.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11

__all__ = ["build_sanitized", "run_tests_against"]

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "sanitize"

_RUNNER = """
import importlib, importlib.util, sys
name, path = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules[name] = module
parent, _, leaf = name.rpartition(".")
setattr(importlib.import_module(parent), leaf, module)
print(f"sanitized module {name} from {path}", flush=True)
import pytest
sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", *sys.argv[3:]]))
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


def build_sanitized(target: str, pattern: str) -> Path:
    """Build CMake ``target`` sanitized; returns the one file under ``build/sanitize`` matching
    ``pattern``."""
    cmake = _cmake()
    # Configured on every run so that a cache from other settings is corrected.
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
        [cmake, "--build", str(BUILD), "--target", target, "--parallel", "2"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    (module,) = BUILD.glob(pattern)
    return module


def run_tests_against(module_name: str, module: Path, tests: list[str]) -> None:
    """Run ``tests`` in a child Python where ``module_name`` is the sanitized ``module``; fail
    on a test failure or any sanitizer report."""
    env = {
        **os.environ,
        "LD_PRELOAD": f"{_compiler_runtime('libasan.so')} {_compiler_runtime('libstdc++.so')}",
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
    }
    run = subprocess.run(
        [sys.executable, "-c", _RUNNER, module_name, str(module), *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    report = run.stdout[-6000:] + run.stderr[-6000:]
    assert run.returncode == 0, report
    # pytest's own summary, the last line: with -s, a test's output may well say "failed".
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert re.search(r"\b\d+ passed\b", summary), report
    assert not re.search(r"\b(failed|errors?)\b", summary), report
    assert "AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    # The child ran the sanitized build, not the installed one.
    assert f"sanitized module {module_name} from {module}" in run.stdout, report
