"""Pulumi mocks that record every declared resource, name Kubernetes objects like the provider's
auto-naming does, and give a Rollout the status a test chooses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi


@dataclass
class Declared:
    """One resource as the program declared it."""

    type: str
    name: str
    inputs: dict[str, Any]


@dataclass
class RecordingMocks(pulumi.runtime.Mocks):
    """Records resources; ``rollout_status`` is returned as every Rollout's live status."""

    rollout_status: dict[str, Any] = field(default_factory=lambda: {"phase": "Healthy"})
    declared: list[Declared] = field(default_factory=list)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        metadata = outputs.get("metadata")
        if isinstance(metadata, dict) and args.typ.startswith("kubernetes:"):
            outputs["metadata"] = {"name": f"{args.name}-x1y2z3", **metadata}
        if args.typ == "kubernetes:argoproj.io/v1alpha1:Rollout":
            outputs["status"] = self.rollout_status
        self.declared.append(Declared(args.typ, args.name, outputs))
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list]:
        return {}, []

    def of_type(self, suffix: str) -> list[Declared]:
        return [d for d in self.declared if d.type.endswith(suffix)]

    def one(self, suffix: str) -> Declared:
        found = self.of_type(suffix)
        assert len(found) == 1, f"expected one {suffix}, declared {[d.type for d in self.declared]}"
        return found[0]
