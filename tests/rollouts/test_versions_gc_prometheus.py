"""``llm-serving versions gc`` against a real Prometheus holding 26 hours of recorded request
counters, editing a stack file whose comments and order must survive."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli import app
from tests.rollouts.prometheus import PrometheusServer, Recording, serve

END = float(int(time.time()) - 60)
START = END - 26 * 3600
STEP = 300.0

STACK = """\
# Production, us-east-1.
config:
  aws:region: us-east-1
  llm-serving:models:
    - id: llama-3-1-70b-instruct
      strategy: red-black   # the default
      versions:
        - version: "2026-10-01"
        - version: "2026-11-15"
    # Consumers pin ranker versions by hostname.
    - id: catalog-ranker-8b
      strategy: versioned
      replicas: 2
      versions:
        - version: v0   # never served here
        - version: v1
        - version: v2
          route_weight: 10
        - version: v2-beta
        - version: v3
          route_weight: 90
        - version: v4
  llm-serving:image:
    tag: 0.1.0-triton26.08
"""


def flat(recording: Recording, model_id: str, version: str, value: float) -> None:
    labels = {"model": model_id, "version": "1", "model_id": model_id, "model_version": version}
    samples = []
    t = START
    while t <= END:
        samples.append((t, value))
        t += STEP
    recording.add("nv_inference_request_success", labels, samples)


def busy(recording: Recording, model_id: str, version: str, per_second: float) -> None:
    labels = {"model": model_id, "version": "1", "model_id": model_id, "model_version": version}
    recording.counter("nv_inference_request_success", labels, per_second, START, END, STEP)
    recording.counter(
        "nv_inference_request_failure", labels | {"reason": "OTHER"}, 0.0, START, END, STEP
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    recording = Recording()
    ranker = "catalog-ranker-8b"
    flat(recording, ranker, "v1", 1234.0)  # served before the window, idle within it
    flat(recording, ranker, "v2", 99.0)  # idle but still weighted
    busy(recording, ranker, "v2-beta", 0.01)  # a consumer still pins it
    busy(recording, ranker, "v3", 5.0)
    flat(recording, ranker, "v4", 0.0)  # newest, not adopted yet
    flat(recording, "llama-3-1-70b-instruct", "2026-10-01", 10.0)
    with serve(recording, Path(tmp_path_factory.mktemp("prometheus"))) as server:
        yield server


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    (tmp_path / "Pulumi.prod-us-east-1.yaml").write_text(STACK, encoding="utf-8")
    return tmp_path


def gc(prometheus: PrometheusServer, stacks: Path, *extra: str):
    return CliRunner().invoke(
        app,
        [
            "versions",
            "gc",
            "--stack",
            "prod-us-east-1",
            "--prometheus",
            prometheus.url,
            "--idle",
            "24h",
            "--stacks-dir",
            str(stacks),
            *extra,
        ],
    )


def test_lists_without_touching_the_stack(prometheus: PrometheusServer, stacks: Path) -> None:
    result = gc(prometheus, stacks)
    assert result.exit_code == 0, result.output
    rows = {" ".join(line.split()[:3]) for line in result.output.splitlines() if "catalog" in line}
    assert rows == {
        "catalog-ranker-8b v0 remove",
        "catalog-ranker-8b v1 remove",
        "catalog-ranker-8b v2 keep",
        "catalog-ranker-8b v2-beta keep",
        "catalog-ranker-8b v3 keep",
        "catalog-ranker-8b v4 keep",
    }
    assert "2 version(s) would be removed" in result.output
    assert (stacks / "Pulumi.prod-us-east-1.yaml").read_text(encoding="utf-8") == STACK


def test_apply_removes_exactly_the_idle_versions(prometheus, stacks: Path) -> None:
    result = gc(prometheus, stacks, "--apply")
    assert result.exit_code == 0, result.output
    assert "removed 2 version(s)" in result.output
    expected = STACK.replace("        - version: v0   # never served here\n", "").replace(
        "        - version: v1\n", ""
    )
    assert (stacks / "Pulumi.prod-us-east-1.yaml").read_text(encoding="utf-8") == expected
    again = gc(prometheus, stacks, "--apply")
    assert "nothing to remove" in again.output


def test_unreachable_prometheus_fails_with_one_line(stacks: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "versions",
            "gc",
            "--stack",
            "prod-us-east-1",
            "--prometheus",
            "http://127.0.0.1:9",
            "--stacks-dir",
            str(stacks),
        ],
    )
    assert result.exit_code == 1
    assert "cannot query Prometheus at http://127.0.0.1:9" in result.output


def test_missing_stack_file_names_it(prometheus, tmp_path: Path) -> None:
    result = gc(prometheus, tmp_path)
    assert result.exit_code == 1
    assert "Pulumi.prod-us-east-1.yaml not found" in result.output
