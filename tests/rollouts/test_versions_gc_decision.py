"""The gc decision as a pure function: never the newest, never a weighted version, never one
younger than the window, and only versions Prometheus watched for the whole window without a
request."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operations.versions_gc import (
    GcError,
    ModelVersions,
    coverage_query,
    decide,
    parse_idle,
    requests_query,
)

START = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
"""The window's start in these tests (now minus the idle window)."""
ALL = [("ranker", f"v{i}") for i in range(8)]
"""Every version these tests name, watched by Prometheus for the whole window."""


def model(
    *versions: str,
    weights: dict[str, int] | None = None,
    strategy: str = "versioned",
    created: dict[str, date] | None = None,
):
    weights, created = weights or {}, created or {}
    return ModelVersions(
        "ranker",
        strategy,
        versions,
        {v: weights.get(v) for v in versions},
        {v: created.get(v) for v in versions},
    )


def idle(*versions: str) -> dict[tuple[str, str], float]:
    return {("ranker", v): 0.0 for v in versions}


def removed(decisions) -> list[str]:
    return [d.version for d in decisions if d.remove]


def test_idle_old_versions_are_removed_and_busy_ones_kept() -> None:
    requests = idle("v1", "v3", "v4") | {("ranker", "v2"): 12.0}
    decisions = decide([model("v1", "v2", "v3", "v4")], requests, ALL, "24h", window_start=START)
    assert removed(decisions) == ["v1", "v3"]
    reasons = {d.version: d.reason for d in decisions}
    assert reasons == {
        "v1": "no requests in 24h",
        "v2": "12 requests in 24h",
        "v3": "no requests in 24h",
        "v4": "newest version",
    }


def test_newest_is_kept_even_when_idle() -> None:
    assert removed(decide([model("v1")], idle("v1"), ALL, "24h", window_start=START)) == []


def test_weighted_version_is_kept_even_when_idle() -> None:
    config = model("v1", "v2", weights={"v1": 0, "v2": 100})
    decisions = decide([config], idle("v1", "v2"), ALL, "7d", window_start=START)
    assert removed(decisions) == []
    assert decisions[0].reason == "route_weight 0"


def test_red_black_models_are_left_alone() -> None:
    config = model("v1", "v2", strategy="red-black")
    assert decide([config], idle("v1", "v2"), ALL, "24h", window_start=START) == []


@settings(max_examples=60)
@given(
    versions=st.lists(st.sampled_from([f"v{i}" for i in range(8)]), min_size=1, unique=True),
    busy=st.sets(st.sampled_from([f"v{i}" for i in range(8)])),
    weighted=st.sets(st.sampled_from([f"v{i}" for i in range(8)])),
)
def test_removal_rule_holds_for_any_configuration(versions, busy, weighted) -> None:
    requests = idle(*versions) | {("ranker", v): 3.0 for v in busy}
    config = model(*versions, weights={v: 50 for v in weighted})
    gone = set(removed(decide([config], requests, ALL, "24h", window_start=START)))
    expected = {v for v in versions[:-1] if v not in busy and v not in weighted}
    assert gone == expected
    assert versions[-1] not in gone


@pytest.mark.parametrize(
    ("value", "window", "delta"),
    [
        ("24h", "24h", timedelta(hours=24)),
        ("90m", "90m", timedelta(minutes=90)),
        ("7d", "7d", timedelta(days=7)),
    ],
)
def test_parse_idle(value: str, window: str, delta: timedelta) -> None:
    assert parse_idle(value) == (window, delta)


@pytest.mark.parametrize("value", ["24", "1y", "0h", "h", "-1h"])
def test_bad_idle_names_the_option(value: str) -> None:
    with pytest.raises(GcError, match="--idle"):
        parse_idle(value)


def test_query_counts_successes_and_failures_per_version() -> None:
    query = requests_query(["ranker", "a.b"], "24h")
    assert query == (
        "sum by (model_id, model_version) (increase({__name__=~"
        '"nv_inference_request_success|nv_inference_request_failure", '
        'model_id=~"a\\\\.b|ranker"}[24h]))'
    )


@pytest.mark.parametrize(
    ("requests", "covered"),
    [
        pytest.param({}, ALL, id="no series"),
        pytest.param({("ranker", "v1"): math.nan}, ALL, id="NaN"),
        pytest.param(idle("v1"), [], id="series does not span the window"),
    ],
)
def test_a_version_without_data_for_the_window_is_kept(requests, covered) -> None:
    decisions = decide([model("v1", "v2")], requests, covered, "24h", window_start=START)
    assert removed(decisions) == []
    assert decisions[0].reason == "no data for the window"


def test_requests_count_even_when_the_series_does_not_span_the_window() -> None:
    decisions = decide([model("v1", "v2")], {("ranker", "v1"): 4.0}, [], "24h", window_start=START)
    assert decisions[0].reason == "4 requests in 24h"


@pytest.mark.parametrize(
    ("created", "remove"),
    [
        (date(2026, 12, 1), False),  # the window's start day: may be deployed after 09:30
        (date(2026, 11, 30), True),  # the whole day lies before the window
        (date(2026, 12, 3), False),
    ],
)
def test_a_version_younger_than_the_window_is_kept(created: date, remove: bool) -> None:
    config = model("v1", "v2", created={"v1": created})
    decisions = decide([config], idle("v1", "v2"), ALL, "24h", window_start=START)
    assert decisions[0].remove is remove
    if not remove:
        assert decisions[0].reason == f"younger than the window (created {created})"


def test_coverage_needs_a_sample_near_both_ends_of_the_window() -> None:
    query = coverage_query(["ranker"], "24h")
    selector = (
        '{__name__=~"nv_inference_request_success|nv_inference_request_failure", '
        'model_id=~"ranker"}'
    )
    assert query == (
        f"group by (model_id, model_version) (last_over_time({selector}[15m] offset 24h))"
        f" and group by (model_id, model_version) (last_over_time({selector}[15m]))"
    )
