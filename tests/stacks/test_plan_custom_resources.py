"""Every custom resource of every stack's plan against the upstream CRD schema of the pinned
version (``../shared/reference/crds/``, whose README says how, and ``crds/`` here for those it
lacks: Envoy Gateway's BackendTrafficPolicy): unknown fields refused,
``x-kubernetes-int-or-string`` as integer or string, ``x-kubernetes-preserve-unknown-fields``
allowing anything. The CRDs' CEL rules (``x-kubernetes-validations``) are evaluated on the same
objects in ``test_plan_custom_resources_cel.py``."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from stacks.kubernetes_objects import kubernetes_objects, validate_object
from tests.support.stack_plans import stack_plan

STACKS = ["prod-us-east-1", "prod-eu-west-1", "prod-ap-northeast-1", "dev-us-west-2", "global"]
CRDS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "crds"
LOCAL_CRDS = Path(__file__).resolve().parent / "crds"
"""Upstream CRDs at the pinned versions that ``CRDS`` lacks, copied unchanged (its README)."""
CRD_FOLDERS = (CRDS, LOCAL_CRDS)


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses fields it does not list."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _schemas() -> dict[tuple[str, str], Any]:
    """``(apiVersion, kind)`` to the strict schema of that served version."""
    schemas = {}
    for path in sorted(p for folder in CRD_FOLDERS for p in folder.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


@cache
def _custom(stack: str) -> list[dict[str, Any]]:
    """The objects of a stack's plan that the Kubernetes schema does not know: custom
    resources. Shared between tests (and with ``test_plan_custom_resources_cel.py``): copy one
    before changing it."""
    return [m for _, m in kubernetes_objects(stack_plan(stack)) if not validate_object(m)[0]]


def _errors(manifest: dict[str, Any]) -> list[str]:
    key = (manifest["apiVersion"], manifest["kind"])
    schema = _schemas().get(key)
    if schema is None:
        return [f"{key}: no CRD in {' or '.join(map(str, CRD_FOLDERS))}"]
    body = {k: v for k, v in manifest.items() if k != "metadata"}
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{manifest['kind']} {manifest['metadata'].get('name')}: "
        f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(body)
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_every_custom_resource_passes_its_crd_schema(stack: str) -> None:
    custom = _custom(stack)
    assert [e for m in custom for e in _errors(m)] == []
    if stack != "global":
        kinds = {m["kind"] for m in custom}
        assert {
            "Gateway",
            "GRPCRoute",
            "HTTPRoute",
            "BackendTrafficPolicy",
            "ScaledObject",
            "PrometheusRule",
        } <= kinds
        assert kinds & {"Rollout", "ServiceMonitor"}


def test_an_unknown_field_fails_its_crd_schema() -> None:
    route = next(m for m in _custom("prod-us-east-1") if m["kind"] == "GRPCRoute")
    route = copy.deepcopy(route)
    route["spec"]["rules"][0]["backendRefs"][0]["weigth"] = 5
    (error,) = _errors(route)
    assert "spec.rules.0.backendRefs.0" in error and "'weigth' was unexpected" in error


def test_a_backend_traffic_policy_with_a_misspelt_timeout_fails_its_crd_schema() -> None:
    policy = next(m for m in _custom("prod-us-east-1") if m["kind"] == "BackendTrafficPolicy")
    assert _errors(policy) == []
    policy = copy.deepcopy(policy)
    policy["spec"]["timeout"]["http"]["requestTimeOut"] = "10m"
    policy["spec"]["timeout"]["http"]["requestTimeout"] = "630"
    errors = _errors(policy)
    assert len(errors) == 2
    assert any("'requestTimeOut' was unexpected" in e for e in errors)
    assert any("spec.timeout.http.requestTimeout: '630' does not match" in e for e in errors)
