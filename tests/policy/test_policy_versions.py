"""The advisory Versioned-age validator on young, old, newest and unrelated Services."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from components.versioned import VersionSpec, age_annotations
from operations.versions_gc import ModelVersions, decide
from policy.versions import check_versioned_age

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SERVICE = "kubernetes:core/v1:Service"


def service(created_at: str, *, newest: str = "false", strategy: str = "versioned") -> dict:
    return {
        "metadata": {
            "name": "llama-v1",
            "labels": {"llm-serving/strategy": strategy, "llm-serving/model-version": "v1"},
            "annotations": {
                "llm-serving/created-at": created_at,
                "llm-serving/newest": newest,
            },
        }
    }


def check(props: dict) -> list[str]:
    return check_versioned_age(SERVICE, props, idle=timedelta(hours=24), now=NOW)


def test_old_versioned_service_is_flagged() -> None:
    messages = check(service("2026-11-20T00:00:00Z"))
    assert len(messages) == 1
    assert "llama-v1" in messages[0] and "versions gc" in messages[0] and "9 days" in messages[0]


def test_young_newest_and_red_black_services_are_not_flagged() -> None:
    assert check(service("2026-11-29T00:00:00Z")) == []
    assert check(service("2026-11-01T00:00:00Z", newest="true")) == []
    assert check(service("2026-11-01T00:00:00Z", strategy="red-black")) == []


def test_bad_timestamp_is_reported() -> None:
    assert "ISO 8601" in check(service("yesterday"))[0]


def test_message_gives_a_gc_command_that_runs() -> None:
    # The window as `versions gc --idle` takes it, and the options gc cannot run without.
    (message,) = check_versioned_age(
        SERVICE, service("2026-11-20T00:00:00Z"), idle=timedelta(minutes=90), now=NOW
    )
    assert "idle window of 90m;" in message
    assert "`llm-serving versions gc --stack <stack> --prometheus <url> --idle 90m`" in message
    (message,) = check(service("2026-11-20T00:00:00Z"))
    assert "idle window of 24h;" in message and "--idle 24h`" in message


def test_a_routed_version_is_not_flagged_at_any_age() -> None:
    # versions gc keeps a version with a route weight; the advice to run it would be noise on
    # every preview. The annotations come from the component that renders the Service.
    routed = VersionSpec(version="v1", created_at="2026-11-01", route_weight=10)
    props = service("2026-11-01")
    props["metadata"]["annotations"] = age_annotations(routed, newest=False)
    assert check(props) == []
    unrouted = VersionSpec(version="v1", created_at="2026-11-01")
    props["metadata"]["annotations"] = age_annotations(unrouted, newest=False)
    assert len(check(props)) == 1


@pytest.mark.parametrize("created", ["2026-11-26", "2026-11-27", "2026-11-28", "2026-11-29"])
@pytest.mark.parametrize("idle", [timedelta(minutes=90), timedelta(hours=24), timedelta(days=2)])
def test_a_created_day_is_old_exactly_when_versions_gc_finds_it_old(
    created: str, idle: timedelta
) -> None:
    # The stack's created_at is a day (the annotation "2026-11-28"): the version may have been
    # deployed in its last second. gc keeps it as "younger than the window" until that whole
    # day lies before the window; advice to run gc before then would be noise.
    flagged = bool(check_versioned_age(SERVICE, service(created), idle=idle, now=NOW))
    model = ModelVersions("m", "versioned", ("v1", "v2"), {}, {"v1": date.fromisoformat(created)})
    verdict = decide([model], {("m", "v1"): 0.0}, [("m", "v1")], "w", window_start=NOW - idle)[0]
    assert flagged == (not verdict.reason.startswith("younger than the window"))
