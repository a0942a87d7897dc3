"""``llm-serving versions gc`` against a stand-in Prometheus on a real port: a stack file that
changes while the gc waits for Prometheus is never overwritten, a Prometheus that watches nodes
of another region (or whose region cannot be told) decides nothing, and odd answers or odd stack
files fail with one line."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from ruamel.yaml import YAML
from typer.testing import Result

from tests.rollouts.versions_gc import run_gc

STACK = """\
config:
  aws:region: us-west-2
  llm-serving:models:
    - id: ranker
      strategy: versioned
      versions:
        - version: v1
        - version: v2
"""

IDLE_V1 = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [{"metric": {"model_id": "ranker", "model_version": "v1"}, "value": [0, "0"]}],
    },
}
"""v1 with no request in the window; as the coverage answer, v1 watched for all of it."""


def nodes(*provider_ids: str) -> dict[str, Any]:
    """The answer to the gc's kube_node_info query: one series per provider ID."""
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"provider_id": p}, "value": [0, "1"]} for p in provider_ids],
        },
    }


US_WEST_2 = nodes("aws:///us-west-2a/i-0a1b2c3d4e5f60001", "aws:///us-west-2b/i-0a1b2c3d4e5f60002")
"""The nodes of the cluster the test stacks (aws:region us-west-2) run in."""


@contextmanager
def stand_in(
    body: Any,
    on_query: Callable[[], None] = lambda: None,
    status: int = 200,
    node_info: Any = US_WEST_2,
    queries: list[str] | None = None,
) -> Iterator[str]:
    """Serve ``body`` (JSON, or a ``str`` as plain text) with ``status`` for every
    ``/api/v1/query`` but those for ``kube_node_info``, answered ``node_info`` (the stack's
    region's nodes unless told), calling ``on_query`` before each answer and adding each query
    to ``queries``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            on_query()
            query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
            if queries is not None:
                queries.append(query)
            answer = node_info if "kube_node_info" in query else body
            text = isinstance(answer, str)
            data = answer.encode() if text else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def gc(url: str, stacks: Path, *extra: str) -> Result:
    return run_gc("s", url, stacks, *extra)


def one_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_the_stand_in_lets_apply_remove_an_idle_version(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    with stand_in(IDLE_V1) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    assert path.read_text(encoding="utf-8") == STACK.replace("        - version: v1\n", "")


def test_an_edit_made_while_the_gc_runs_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    added = "        - version: v3\n"

    def someone_edits() -> None:
        if added not in path.read_text(encoding="utf-8"):
            with path.open("a", encoding="utf-8") as handle:
                handle.write(added)

    with stand_in(IDLE_V1, someone_edits) as url:
        line = one_line(gc(url, tmp_path, "--apply"))
    assert line == f"{path} changed while the gc ran; nothing written, run the gc again"
    assert path.read_text(encoding="utf-8") == STACK + added
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.s.yaml"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"status": "success"}, id="no data"),
        pytest.param({"status": "success", "data": {"result": [{"metric": {}}]}}, id="no value"),
        pytest.param({"status": "success", "data": {"result": "x"}}, id="result not a list"),
        pytest.param([1, 2], id="not an object"),
    ],
)
def test_an_answer_that_is_no_prometheus_vector_fails_with_one_line(
    tmp_path: Path, body: Any
) -> None:
    (tmp_path / "Pulumi.s.yaml").write_text(STACK, encoding="utf-8")
    with stand_in(body) as url:
        line = one_line(gc(url, tmp_path))
    assert url in line


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            STACK.replace(
                "versions:\n        - version: v1\n        - version: v2", "versions: [v1, v2]"
            ),
            "llm-serving:models[0].versions[0]: expected a mapping like {version: v1}, got 'v1'",
            id="versions as strings",
        ),
        pytest.param("config: [\n", "is not valid YAML: expected the node content", id="not YAML"),
        pytest.param("- a\n", "config has no llm-serving:models", id="a list"),
        pytest.param(
            STACK.replace("  aws:region: us-west-2\n", ""),
            "config has no aws:region; gc needs it to check that --prometheus watches this "
            "stack's cluster",
            id="no aws:region",
        ),
        pytest.param(
            STACK + '          created_at: "last week"\n',
            "versions[1].created_at: 'last week' is not a date like 2026-11-02",
            id="created_at not a date",
        ),
    ],
)
def test_a_malformed_stack_file_fails_with_one_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(text, encoding="utf-8")
    line = one_line(gc("http://127.0.0.1:9", tmp_path))
    assert line.startswith(str(path))
    assert problem in line


# Written the way `pulumi config set` writes lists (dashes not indented), with comments that
# describe the version below them.
POSTED_STYLE = """\
# dev stack
config:
  aws:region: us-west-2
  llm-serving:models:
  - id: ranker
    strategy: versioned
    versions:
    # v1: the first build
    - version: v1   # idle
      created_at: 2026-01-02

    # v2: pinned by search until Q1; never remove it by hand
    - version: v2
  llm-serving:zones: [us-west-2a, us-west-2b]
"""


def test_apply_removes_only_the_entry_and_its_comments(tmp_path: Path) -> None:
    # Every other line stays byte for byte: the layout and the comments of the kept versions.
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(POSTED_STYLE, encoding="utf-8")
    with stand_in(IDLE_V1) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    removed = (
        "    # v1: the first build\n    - version: v1   # idle\n      created_at: 2026-01-02\n"
    )
    assert path.read_text(encoding="utf-8") == POSTED_STYLE.replace(removed, "")


def test_apply_still_edits_a_flow_style_versions_list(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    flow = STACK.replace(
        "versions:\n        - version: v1\n        - version: v2",
        "versions: [{version: v1}, {version: v2}]",
    )
    path.write_text(flow, encoding="utf-8")
    with stand_in(IDLE_V1) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    document = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    assert document["config"]["llm-serving:models"][0]["versions"] == [{"version": "v2"}]


@pytest.mark.parametrize(
    "warning",
    [
        "remote_read: error sending request: connection refused",  # Prometheus' remote read
        "No StoreAPIs matched for this query",  # a Thanos querier with a store down
    ],
)
def test_a_partial_answer_removes_nothing(tmp_path: Path, warning: str) -> None:
    # Warnings mean "the data field holds what could be collected": a version whose series
    # were on the missing part would look idle.
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    with stand_in(IDLE_V1 | {"warnings": [warning]}) as url:
        line = one_line(gc(url, tmp_path, "--apply"))
    assert line == (
        f"Prometheus at {url} answered with partial data ({warning}); a version whose series "
        "are missing would look idle, so nothing was decided and the stack file was not changed"
    )
    assert path.read_text(encoding="utf-8") == STACK


def test_an_info_annotation_is_not_partial_data(tmp_path: Path) -> None:
    # Prometheus 2.4x returned PromQL info annotations among the warnings; the counter names
    # (no _total suffix) draw one on every increase().
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    info = (
        "PromQL info: metric might not be a counter, name does not end in "
        '_total/_sum/_count/_bucket: "nv_inference_request_success" (1:52)'
    )
    with stand_in(IDLE_V1 | {"warnings": [info], "infos": [info]}) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    assert path.read_text(encoding="utf-8") == STACK.replace("        - version: v1\n", "")


@pytest.mark.parametrize(
    ("status", "text"),
    [(401, "Unauthorized"), (403, "Forbidden"), (502, "<html>Bad Gateway</html>")],
)
def test_an_http_error_says_the_status_and_hides_the_password(
    tmp_path: Path, status: int, text: str
) -> None:
    (tmp_path / "Pulumi.s.yaml").write_text(STACK, encoding="utf-8")
    with stand_in(text, status=status) as url:
        line = one_line(gc(url.replace("http://", "http://ops:s3cret@"), tmp_path))
    shown = url.replace("http://", "http://ops:***@")
    assert line.startswith(f"Prometheus at {shown} answered HTTP {status} ")
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("provider_ids", "seen"),
    [
        pytest.param(
            ["aws:///us-east-1a/i-0a1b2c3d4e5f60001", "aws:///us-east-1c/i-0a1b2c3d4e5f60002"],
            "us-east-1",
            id="another region",
        ),
        pytest.param(
            ["aws:///us-west-2a/i-0a1b2c3d4e5f60001", "aws:///eu-west-1b/i-0a1b2c3d4e5f60002"],
            "eu-west-1, us-west-2",
            id="mixed regions",
        ),
        pytest.param(
            ["aws:///us-west-2a/i-0a1b2c3d4e5f60001", "aws:///us-east-1-bos-1a/i-0a1b2c3d4e5f6003"],
            "us-east-1, us-west-2",
            id="another region's local zone",
        ),
    ],
)
def test_a_prometheus_that_watches_another_region_decides_nothing(
    tmp_path: Path, provider_ids: list[str], seen: str
) -> None:
    # The counters carry no cluster label: another region's idle versions would look idle here.
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    for extra in ((), ("--apply",)):
        with stand_in(IDLE_V1, node_info=nodes(*provider_ids)) as url:
            line = one_line(gc(url, tmp_path, *extra))
        assert line == (
            f"Prometheus at {url} watched nodes in {seen} in the last 24h (kube_node_info), but "
            "stack s is in us-west-2 (aws:region); its request counters may be another region's, "
            "so nothing was decided and the stack file was not changed; point --prometheus at "
            "the Prometheus of the us-west-2 cluster"
        )
    assert path.read_text(encoding="utf-8") == STACK


@pytest.mark.parametrize(
    ("node_info", "example"),
    [
        pytest.param(nodes(), "", id="no kube_node_info"),
        pytest.param(nodes(""), "", id="no provider_id"),
        pytest.param(
            nodes("kind://docker/kind/kind-worker", ""),
            " (provider_id 'kind://docker/kind/kind-worker')",
            id="not an EKS node",
        ),
    ],
)
def test_a_prometheus_whose_region_cannot_be_told_decides_nothing(
    tmp_path: Path, node_info: Any, example: str
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    with stand_in(IDLE_V1, node_info=node_info) as url:
        line = one_line(gc(url, tmp_path, "--apply"))
    assert line == (
        f"Prometheus at {url} has no kube_node_info series with an aws:///<zone>/<instance> "
        f"provider_id in the last 24h{example}, so gc cannot tell which cluster it watches; "
        "nothing was decided and the stack file was not changed; check that --prometheus is the "
        "Prometheus of the us-west-2 cluster and that it scrapes kube-state-metrics "
        "(kube-prometheus-stack's kubeStateMetrics)"
    )
    assert path.read_text(encoding="utf-8") == STACK


def test_a_local_zone_node_counts_as_its_parent_region(tmp_path: Path) -> None:
    # us-west-2-lax-1a is a Local Zone of us-west-2; a node without a provider ID yet (being
    # initialised) tells no region and does not stop the gc.
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    queries: list[str] = []
    node_info = nodes("aws:///us-west-2-lax-1a/i-0a1b2c3d4e5f60001", "aws:///us-west-2b/i-2", "")
    with stand_in(IDLE_V1, node_info=node_info, queries=queries) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    assert path.read_text(encoding="utf-8") == STACK.replace("        - version: v1\n", "")
    # The region is checked before the request counters are read.
    assert queries[0] == "group by (provider_id) (last_over_time(kube_node_info[24h]))"


def test_a_stack_path_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.s.yaml").mkdir()
    line = one_line(gc("http://127.0.0.1:9", tmp_path))
    assert line.startswith(f"cannot read stack file {tmp_path / 'Pulumi.s.yaml'}: Is a directory")


def test_a_failed_write_leaves_the_stack_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("operations.versions_gc.os.fsync", full)
    with stand_in(IDLE_V1) as url:
        line = one_line(gc(url, tmp_path, "--apply"))
    assert line == (f"cannot write stack file {path}: No space left on device; it was not changed")
    assert path.read_text(encoding="utf-8") == STACK
    assert [p.name for p in tmp_path.iterdir()] == ["Pulumi.s.yaml"]


def test_the_new_stack_file_is_on_disk_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(STACK, encoding="utf-8")
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        "operations.versions_gc.os.fsync", lambda fd: (synced.append("fsync"), real_fsync(fd))
    )
    monkeypatch.setattr(
        "operations.versions_gc.os.replace",
        lambda a, b: (synced.append("replace"), real_replace(a, b)),
    )
    with stand_in(IDLE_V1) as url:
        result = gc(url, tmp_path, "--apply")
    assert result.exit_code == 0, result.output
    assert synced == ["fsync", "replace"]
    assert path.read_text(encoding="utf-8") == STACK.replace("        - version: v1\n", "")
