"""The gc decision as a pure function: never the newest, never a weighted version, and only
versions without a request in the window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.versions_gc import GcError, ModelVersions, decide, parse_idle, requests_query


def model(*versions: str, weights: dict[str, int] | None = None, strategy: str = "versioned"):
    weights = weights or {}
    return ModelVersions("ranker", strategy, versions, {v: weights.get(v) for v in versions})


def removed(decisions) -> list[str]:
    return [d.version for d in decisions if d.remove]


def test_idle_old_versions_are_removed_and_busy_ones_kept() -> None:
    decisions = decide(
        [model("v1", "v2", "v3", "v4")], {("ranker", "v2"): 12.0, ("ranker", "v4"): 0.0}, "24h"
    )
    assert removed(decisions) == ["v1", "v3"]
    reasons = {d.version: d.reason for d in decisions}
    assert reasons == {
        "v1": "no requests in 24h",
        "v2": "12 requests in 24h",
        "v3": "no requests in 24h",
        "v4": "newest version",
    }


def test_newest_is_kept_even_when_idle() -> None:
    assert removed(decide([model("v1")], {}, "24h")) == []


def test_weighted_version_is_kept_even_when_idle() -> None:
    decisions = decide([model("v1", "v2", weights={"v1": 0, "v2": 100})], {}, "7d")
    assert removed(decisions) == []
    assert decisions[0].reason == "route_weight 0"


def test_red_black_models_are_left_alone() -> None:
    assert decide([model("v1", "v2", strategy="red-black")], {}, "24h") == []


@settings(max_examples=60, deadline=None)
@given(
    versions=st.lists(st.sampled_from([f"v{i}" for i in range(8)]), min_size=1, unique=True),
    busy=st.sets(st.sampled_from([f"v{i}" for i in range(8)])),
    weighted=st.sets(st.sampled_from([f"v{i}" for i in range(8)])),
)
def test_removal_rule_holds_for_any_configuration(versions, busy, weighted) -> None:
    requests = {("ranker", v): 3.0 for v in busy}
    config = model(*versions, weights={v: 50 for v in weighted})
    gone = set(removed(decide([config], requests, "24h")))
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
