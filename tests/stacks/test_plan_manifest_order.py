"""A plan's Kubernetes files depend on the objects' content alone, not on the key order the
engine happened to hand them over in, so that a plan diffs cleanly between runs."""

from __future__ import annotations

import random

import yaml

from stacks.kubernetes_objects import manifest_yaml

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "m", "namespace": "models", "labels": {"b": "2", "a": "1"}},
    "spec": {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [
                    {"name": "triton", "image": "x", "args": ["--b", "--a"]},
                    {"name": "frontend", "image": "y", "command": ["run", "script\nline 2"]},
                ]
            }
        },
    },
}


def _shuffled(value: object, rng: random.Random) -> object:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


def test_the_same_object_in_any_key_order_writes_the_same_bytes() -> None:
    expected = manifest_yaml(DEPLOYMENT)
    rng = random.Random(7)
    variants = {manifest_yaml(_shuffled(DEPLOYMENT, rng)) for _ in range(20)}
    assert variants == {expected}
    # Nothing is lost or reordered where order means something (lists, multi-line scripts).
    assert yaml.safe_load(expected) == DEPLOYMENT
    assert expected.index("--b") < expected.index("--a")
    assert "command:\n" in expected and "|-" in expected


def test_identity_comes_first_then_the_rest_sorted() -> None:
    lines = manifest_yaml(_shuffled(DEPLOYMENT, random.Random(1))).splitlines()
    top = [line.split(":")[0] for line in lines if line and not line.startswith(" ")]
    assert top == ["apiVersion", "kind", "metadata", "spec"]
    assert lines[lines.index("  labels:") + 1] == "    a: '1'"
