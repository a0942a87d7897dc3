"""The engine's default thread count follows the pod's CPU limit (cgroup v2 ``cpu.max``) or its
affinity mask, never the node's core count; the environment override still wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.constraints import _engine
from runtime.constraints.engine import ConstraintEngine
from runtime.constraints.threads import default_num_threads, pod_cpu_count

NODE = set(range(192))  # a p5.48xlarge's vCPUs, all in the affinity mask of an unpinned pod


def node_affinity(pid: int) -> set[int]:
    return NODE


def cpu_max(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpu.max"
    path.write_text(text, encoding="ascii")
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [("400000 100000\n", 4), ("250000 100000\n", 3), ("50000 100000\n", 1), ("800 1000\n", 1)],
)
def test_the_cgroup_quota_gives_the_count(tmp_path: Path, text: str, expected: int) -> None:
    assert pod_cpu_count(cpu_max(tmp_path, text), node_affinity) == expected


@pytest.mark.parametrize("text", ["max 100000\n", "garbage\n", "0 100000\n", "100 0\n"])
def test_no_quota_falls_back_to_affinity(tmp_path: Path, text: str) -> None:
    assert pod_cpu_count(cpu_max(tmp_path, text), node_affinity) == 192
    assert pod_cpu_count(cpu_max(tmp_path, text), lambda pid: {0, 5}) == 2


def test_without_cgroup_v2_the_affinity_mask_counts(tmp_path: Path) -> None:
    assert pod_cpu_count(tmp_path / "absent", lambda pid: {3, 4, 7}) == 3


def test_a_pinned_pod_uses_the_smaller_of_quota_and_affinity(tmp_path: Path) -> None:
    assert pod_cpu_count(cpu_max(tmp_path, "800000 100000"), lambda pid: {0, 1}) == 2


@pytest.mark.parametrize(
    ("value", "expected"), [("3", 3), (" 5 ", 5), ("+2", 2), ("0", 4), ("-1", 4), ("x", 4), ("", 4)]
)
def test_the_environment_override_wins_when_valid(
    tmp_path: Path, value: str, expected: int
) -> None:
    environ = {_engine.THREADS_ENV_VAR: value}
    limit = cpu_max(tmp_path, "400000 100000")
    assert default_num_threads(environ, limit, node_affinity) == expected


def test_the_engine_starts_with_the_pod_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtime.constraints.engine.default_num_threads", lambda: 2)
    assert ConstraintEngine(4, 64).num_threads == 2
