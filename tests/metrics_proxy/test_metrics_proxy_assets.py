"""The shipped dashboard, alert rules and rollout queries load, parse and cover the issue's list."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from contracts.promql import (
    ANY_VERSION,
    ROLLOUT_PLACEHOLDERS,
    AssetError,
    load_alert_groups,
    load_dashboard,
    placeholders_of,
    render_rollout_query,
    rollout_queries,
    rollout_success_conditions,
)
from tests.metrics_proxy.promql import all_expressions, dashboard_expressions


def test_dashboard_panels_cover_required_signals() -> None:
    exprs = " ".join(e.promql for e in dashboard_expressions("m"))
    for series in (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
    ):
        assert series in exprs, series
    variables = {v["name"] for v in load_dashboard()["templating"]["list"]}
    assert {"model_id", "model_version", "colour"} <= variables


def test_every_dashboard_query_groups_by_version_and_colour() -> None:
    for expr in dashboard_expressions("m"):
        assert "model_version" in expr.promql and "colour" in expr.promql, expr.origin


def test_alerts_cover_required_conditions() -> None:
    names = {rule["alert"] for group in load_alert_groups() for rule in group["rules"]}
    assert names == {
        "LLMServingHighFailureRatio",
        "LLMServingTTFTOverBudget",
        "LLMServingKVCacheSaturated",
        "LLMServingRequestsWaitingGrowing",
        "LLMServingMetricsSourceDown",
    }


def test_rollout_queries_use_explicit_placeholders() -> None:
    queries = rollout_queries()
    assert {"success_ratio", "ttft_p95"} <= set(queries)
    for name, query in queries.items():
        assert placeholders_of(query) == ROLLOUT_PLACEHOLDERS, name
        assert "{{" not in query, name
    assert set(rollout_success_conditions()) == set(queries)


def test_rendered_queries_match_one_version_or_any() -> None:
    query = rollout_queries()["ttft_p95"]
    one = render_rollout_query(query, model_id="m", colour="blue", model_version="v2")
    assert 'model_id="m", model_version="v2", colour="blue"' in one
    anyone = render_rollout_query(query, model_id="m", colour="c", model_version=ANY_VERSION)
    assert 'model_version!=""' in anyone
    with pytest.raises(AssetError, match="version"):
        render_rollout_query('x{v="${version}"}', model_id="m", colour="c", model_version=None)


def test_promtool_parses_every_expression(tmp_path) -> None:
    # promtool parses PromQL only inside rule files: wrap each query in a recording rule.
    exprs = all_expressions("m", "v1", "blue")
    rules = [{"record": f"check:expr_{i}", "expr": e.promql} for i, e in enumerate(exprs)]
    path = tmp_path / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(exprs)} rules found" in out.stdout


def test_promtool_accepts_alert_rule_file(tmp_path) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump({"groups": load_alert_groups()}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_layout_is_consistent() -> None:
    panels = load_dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        grid = panel["gridPos"]
        cell = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & cell, f"{panel['title']} overlaps another panel"
        cells |= cell
