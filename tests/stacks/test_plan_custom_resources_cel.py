"""The CEL rules (``x-kubernetes-validations``) of the pinned CRDs (``../shared/reference/crds/``,
and ``crds/`` here for those it lacks) on every custom resource of every stack's plan, evaluated
as the API server evaluates them on create (``tests/support/kubernetes_cel.py`` says how: schema
defaults first, transition rules skipped). The schema itself is checked in
``test_plan_custom_resources.py``, whose plans these tests share."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.stacks.test_plan_custom_resources import CRD_FOLDERS, STACKS, _custom
from tests.support.kubernetes_cel import CrdRules, Outcome

Manifest = dict[str, Any]


@cache
def _folders() -> tuple[CrdRules, ...]:
    return tuple(CrdRules(folder) for folder in CRD_FOLDERS)


def _crd_rules(key: tuple[str, str]) -> CrdRules:
    """The rules of the folder that holds the CRD of ``key``, ``(apiVersion, kind)``."""
    found = [rules for rules in _folders() if key in rules.versions]
    assert len(found) == 1, f"{key}: {len(found)} CRDs in {', '.join(map(str, CRD_FOLDERS))}"
    return found[0]


def _validate(manifest: Manifest) -> Outcome:
    return _crd_rules((manifest["apiVersion"], manifest["kind"])).validate(manifest)


def _first(kind: str) -> Manifest:
    """A copy of the first object of that kind in prod-us-east-1's plan."""
    return copy.deepcopy(next(m for m in _custom("prod-us-east-1") if m["kind"] == kind))


def test_every_rule_of_the_pinned_crds_can_be_evaluated() -> None:
    folders = _folders()
    assert [problem for rules in folders for problem in rules.problems] == []
    every = {key: found for rules in folders for key, found in rules.rules.items()}
    with_rules = {kind for (_, kind), found in every.items() if found}
    assert with_rules == {
        "BackendTrafficPolicy",
        "Gateway",
        "GatewayClass",
        "GRPCRoute",
        "HTTPRoute",
    }
    transition = {str(r) for found in every.values() for r in found if r.transition}
    assert transition == {
        f"gatewayclasses.gateway.networking.k8s.io/{v} .spec.controllerName: self == oldSelf"
        for v in ("v1", "v1beta1")
    }


@pytest.mark.parametrize("stack", STACKS)
def test_every_custom_resource_passes_its_crd_rules(stack: str) -> None:
    violations: list[str] = []
    evaluated: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for manifest in _custom(stack):
        outcome = _validate(manifest)
        name = f"{manifest['kind']} {manifest['metadata'].get('name')}"
        violations += [f"{name}: {v}" for v in outcome.violations]
        evaluated[manifest["kind"]] += len(outcome.evaluated)
        skipped[manifest["kind"]] += len(outcome.transition_skipped)
    assert violations == []
    # Every kind of the plan whose CRD has rules had some of them run (or, for GatewayClass,
    # whose only rule is a transition rule, skipped).
    for manifest in _custom(stack):
        key = (manifest["apiVersion"], manifest["kind"])
        found = _crd_rules(key).rules[key]
        if any(not r.transition for r in found):
            assert evaluated[manifest["kind"]] > 0, manifest["kind"]
        elif found:
            assert skipped[manifest["kind"]] > 0, manifest["kind"]
    if stack != "global":
        kinds = ("Gateway", "GRPCRoute", "HTTPRoute", "BackendTrafficPolicy")
        assert min(evaluated[k] for k in kinds) > 0
        assert skipped["GatewayClass"] > 0


def _tls_on_http(gateway: Manifest) -> None:
    listener = gateway["spec"]["listeners"][0]
    assert listener["protocol"] == "HTTP"
    listener["tls"] = {"mode": "Terminate", "certificateRefs": [{"name": "llm-serving-tls"}]}


def _long_annotation_prefix(gateway: Manifest) -> None:
    # Matches the key pattern; only the rule that splits the key at "/" refuses it.
    gateway["spec"]["infrastructure"] = {"annotations": {"a" * 253 + "/owner": "platform"}}


def _service_backend_without_port(route: Manifest) -> None:
    # group and kind are absent: only their schema defaults ("" and Service) make it a Service.
    del route["spec"]["rules"][0]["backendRefs"][0]["port"]


def _double_slash_path(route: Manifest) -> None:
    route["spec"]["rules"][0]["matches"] = [{"path": {"type": "PathPrefix", "value": "/v1//chat"}}]


def _same_parent_twice(route: Manifest) -> None:
    # ``namespace`` is ``__namespace__`` in the rule: a wrong escape would see no namespace.
    route["spec"]["parentRefs"].append(dict(route["spec"]["parentRefs"][0]))


BROKEN: list[tuple[str, Callable[[Manifest], None], str, str]] = [
    (
        "Gateway",
        _tls_on_http,
        "spec.listeners",
        "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']",
    ),
    (
        "Gateway",
        _long_annotation_prefix,
        "spec.infrastructure.annotations",
        "If specified, the annotation key's prefix must be a DNS subdomain not longer than 253 "
        "characters in total.",
    ),
    (
        "GRPCRoute",
        _service_backend_without_port,
        "spec.rules[0].backendRefs[0]",
        "Must have port for Service reference",
    ),
    (
        "HTTPRoute",
        _double_slash_path,
        "spec.rules[0].matches[0].path",
        "must not contain '//' when type one of ['Exact', 'PathPrefix']",
    ),
    (
        "HTTPRoute",
        _same_parent_twice,
        "spec.parentRefs",
        "sectionName must be unique when parentRefs includes 2 or more references to the same "
        "parent",
    ),
]


@pytest.mark.parametrize(
    ("kind", "breaks", "path", "message"), BROKEN, ids=[b.__name__[1:] for _, b, _, _ in BROKEN]
)
def test_a_broken_plan_object_fails_the_rule_it_breaks(
    kind: str, breaks: Callable[[Manifest], None], path: str, message: str
) -> None:
    manifest = _first(kind)
    assert _validate(manifest).violations == []
    breaks(manifest)
    (violation,) = _validate(manifest).violations
    assert (violation.path, violation.message, violation.error) == (path, message, False)
    assert violation.rule.crd.startswith(f"{kind.lower()}s.gateway.networking.k8s.io/v1")


def test_a_backend_traffic_policy_on_a_service_fails_the_rule_it_breaks() -> None:
    policy = _first("BackendTrafficPolicy")
    assert _validate(policy).violations == []
    policy["spec"]["targetRefs"][0].update(group="", kind="Service")
    violations = _validate(policy).violations
    assert sorted(v.message for v in violations) == [
        "this policy can only have a targetRefs[*].group of gateway.networking.k8s.io",
        "this policy can only have a targetRefs[*].kind of "
        "Gateway/HTTPRoute/GRPCRoute/TCPRoute/UDPRoute/TLSRoute",
    ]
    assert {(v.path, v.error, v.rule.crd) for v in violations} == {
        ("spec", False, "backendtrafficpolicies.gateway.envoyproxy.io/v1alpha1")
    }


def test_the_same_parent_in_another_namespace_is_another_parent() -> None:
    route = _first("HTTPRoute")
    route["spec"]["parentRefs"].append({**route["spec"]["parentRefs"][0], "namespace": "edge"})
    assert _validate(route).violations == []


CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              name:
                type: string
                x-kubernetes-validations:
                - rule: self.lowerAscii() == self
                - rule: self == oldSelf
                  message: immutable
              size:
                type: integer
                x-kubernetes-validations:
                - rule: self.missing > 0
                - rule: self < 10
                  messageExpression: "'size ' + string(self) + ' is not below 10'"
"""


def test_a_rule_that_cannot_be_evaluated_is_reported_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "widgets.yaml").write_text(CRD)
    rules = CrdRules(tmp_path)
    assert rules.problems == [
        "widgets.example.com/v1 .spec.name: self.lowerAscii() == self: "
        "calls lowerAscii: not implemented here"
    ]
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    outcome = rules.validate({**widget, "spec": {"name": "w", "size": 12}})
    compiled, runs, fails = outcome.violations
    assert (compiled.path, compiled.message, compiled.error) == (
        "spec.name",
        "the rule could not be compiled",
        True,
    )
    assert (runs.path, runs.rule.rule, runs.error) == ("spec.size", "self.missing > 0", True)
    assert "does not support field selection" in runs.message
    assert (fails.path, fails.message, fails.error) == (
        "spec.size",
        "size 12 is not below 10",
        False,
    )
    assert [r.rule for r in outcome.transition_skipped] == ["self == oldSelf"]
    assert len(outcome.evaluated) == 3
