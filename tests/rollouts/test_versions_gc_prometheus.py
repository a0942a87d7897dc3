"""``llm-serving versions gc`` against a real Prometheus of the us-east-1 cluster holding 26 hours
of recorded request counters and kube-state-metrics' node info, editing a stack file whose
comments, order and mode must survive; the same Prometheus decides nothing for another region's
stack."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import Result

from tests.rollouts.prometheus import PrometheusServer, Recording, serve
from tests.rollouts.versions_gc import run_gc

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
        - version: v1-hotfix   # scraped for the last 2 hours only
        - version: v1-gone     # its scrape broke 20 hours ago
        - version: v1-unseen   # no series at all
        - version: v2
          route_weight: 10
        - version: v2-beta
        - version: v3
          route_weight: 90
        - version: v4
  llm-serving:image:
    tag: 0.1.0-triton26.08
"""


def labels(model_id: str, version: str) -> dict[str, str]:
    return {"model": model_id, "version": "1", "model_id": model_id, "model_version": version}


def flat(
    recording: Recording, model_id: str, version: str, value: float, start: float, end: float
) -> None:
    samples = []
    t = start
    while t <= end:
        samples.append((t, value))
        t += STEP
    recording.add("nv_inference_request_success", labels(model_id, version), samples)


def busy(
    recording: Recording, model_id: str, version: str, per_second: float, start: float, end: float
) -> None:
    series = labels(model_id, version)
    recording.counter("nv_inference_request_success", series, per_second, start, end, STEP)
    recording.counter(
        "nv_inference_request_failure", series | {"reason": "OTHER"}, 0.0, start, end, STEP
    )


def node(recording: Recording, name: str, provider_id: str, start: float, end: float) -> None:
    """kube-state-metrics' ``kube_node_info`` for one node, from ``start`` to ``end``."""
    samples = []
    t = start
    while t <= end:
        samples.append((t, 1.0))
        t += STEP
    series = {"job": "kube-state-metrics", "node": name, "provider_id": provider_id}
    recording.add("kube_node_info", series, samples)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    # Timed here, not at import: the gc wants a sample from the last minutes.
    end = float(int(time.time()) - 60)
    start = end - 26 * 3600
    recording = Recording()
    ranker = "catalog-ranker-8b"
    flat(recording, ranker, "v0", 0.0, start, end)  # deployed, never served
    flat(recording, ranker, "v1", 1234.0, start, end)  # served before the window, idle within it
    flat(recording, ranker, "v1-hotfix", 0.0, end - 2 * 3600, end)
    flat(recording, ranker, "v1-gone", 7.0, start, end - 20 * 3600)
    flat(recording, ranker, "v2", 99.0, start, end)  # idle but still weighted
    busy(recording, ranker, "v2-beta", 0.01, start, end)  # a consumer still pins it
    busy(recording, ranker, "v3", 5.0, start, end)
    flat(recording, ranker, "v4", 0.0, start, end)  # newest, not adopted yet
    flat(recording, "llama-3-1-70b-instruct", "2026-10-01", 10.0, start, end)
    # The cluster's nodes (us-east-1, the stack's aws:region); a GPU node scaled in 6 hours ago.
    node(recording, "ip-10-0-1-10", "aws:///us-east-1a/i-0a1b2c3d4e5f60001", start, end)
    node(recording, "ip-10-0-2-20", "aws:///us-east-1b/i-0a1b2c3d4e5f60002", start, end)
    node(recording, "ip-10-0-3-30", "aws:///us-east-1c/i-0a1b2c3d4e5f60003", start, end - 6 * 3600)
    with serve(recording, Path(tmp_path_factory.mktemp("prometheus"))) as server:
        yield server


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    (tmp_path / "Pulumi.prod-us-east-1.yaml").write_text(STACK, encoding="utf-8")
    return tmp_path


def gc(prometheus: PrometheusServer, stacks: Path, *extra: str) -> Result:
    return run_gc("prod-us-east-1", prometheus.url, stacks, "--idle", "24h", *extra)


def test_lists_without_touching_the_stack(prometheus: PrometheusServer, stacks: Path) -> None:
    result = gc(prometheus, stacks)
    assert result.exit_code == 0, result.output
    rows = {" ".join(line.split()[:3]) for line in result.output.splitlines() if "catalog" in line}
    assert rows == {
        "catalog-ranker-8b v0 remove",
        "catalog-ranker-8b v1 remove",
        "catalog-ranker-8b v1-hotfix keep",
        "catalog-ranker-8b v1-gone keep",
        "catalog-ranker-8b v1-unseen keep",
        "catalog-ranker-8b v2 keep",
        "catalog-ranker-8b v2-beta keep",
        "catalog-ranker-8b v3 keep",
        "catalog-ranker-8b v4 keep",
    }
    assert "2 version(s) would be removed" in result.output
    unwatched = [line for line in result.output.splitlines() if "v1-" in line]
    assert all(line.endswith("no data for the window") for line in unwatched), unwatched
    assert (stacks / "Pulumi.prod-us-east-1.yaml").read_text(encoding="utf-8") == STACK


def test_apply_removes_exactly_the_idle_versions(prometheus, stacks: Path) -> None:
    path = stacks / "Pulumi.prod-us-east-1.yaml"
    path.chmod(0o644)
    result = gc(prometheus, stacks, "--apply")
    assert result.exit_code == 0, result.output
    assert "removed 2 version(s)" in result.output
    expected = STACK.replace("        - version: v0   # never served here\n", "").replace(
        "        - version: v1\n", ""
    )
    assert path.read_text(encoding="utf-8") == expected
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    again = gc(prometheus, stacks, "--apply")
    assert "nothing to remove" in again.output


def test_unreachable_prometheus_fails_with_one_line(stacks: Path) -> None:
    result = run_gc("prod-us-east-1", "http://127.0.0.1:9", stacks)
    assert result.exit_code == 1
    assert "cannot query Prometheus at http://127.0.0.1:9" in result.output


def test_missing_stack_file_names_it(prometheus, tmp_path: Path) -> None:
    result = gc(prometheus, tmp_path)
    assert result.exit_code == 1
    assert "Pulumi.prod-us-east-1.yaml not found" in result.output


def test_apply_refuses_when_prometheus_has_no_series_for_any_version(prometheus, tmp_path) -> None:
    # A fresh Prometheus or another cluster's: no answer is not "no requests".
    stack = STACK.replace("catalog-ranker-8b", "catalog-ranker-70b")
    (tmp_path / "Pulumi.prod-us-east-1.yaml").write_text(stack, encoding="utf-8")
    listed = gc(prometheus, tmp_path)
    assert listed.exit_code == 0, listed.output
    assert "nothing to remove" in listed.output
    result = gc(prometheus, tmp_path, "--apply")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Prometheus at {prometheus.url} has no request counters for catalog-ranker-70b in 24h; "
        "check --prometheus and the scrape of the serving metrics; the stack file was not changed"
    ]
    assert (tmp_path / "Pulumi.prod-us-east-1.yaml").read_text(encoding="utf-8") == stack


def test_a_url_that_is_not_the_base_url_says_so(prometheus: PrometheusServer, stacks) -> None:
    # Prometheus answers a path it does not serve with a plain-text 404.
    result = run_gc("prod-us-east-1", f"{prometheus.url}/prometheus", stacks)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Prometheus at {prometheus.url}/prometheus answered HTTP 404 Not Found, not a query "
        "result (404 page not found); check that --prometheus is the base URL (the part before "
        "/api/v1) and any credentials it needs"
    ]


def test_another_regions_prometheus_decides_nothing(prometheus: PrometheusServer, tmp_path) -> None:
    # gc of prod-eu-west-1 pointed at us-east-1's Prometheus: both list the same model ids, so
    # v0 and v1, idle in us-east-1, would be removed from eu-west-1 where they may be live.
    stack = STACK.replace("us-east-1", "eu-west-1")
    path = tmp_path / "Pulumi.prod-eu-west-1.yaml"
    path.write_text(stack, encoding="utf-8")
    for extra in ((), ("--apply",)):
        result = run_gc("prod-eu-west-1", prometheus.url, tmp_path, "--idle", "24h", *extra)
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [
            f"Prometheus at {prometheus.url} watched nodes in us-east-1 in the last 24h "
            "(kube_node_info), but stack prod-eu-west-1 is in eu-west-1 (aws:region); its request "
            "counters may be another region's, so nothing was decided and the stack file was not "
            "changed; point --prometheus at the Prometheus of the eu-west-1 cluster"
        ]
    assert path.read_text(encoding="utf-8") == stack
