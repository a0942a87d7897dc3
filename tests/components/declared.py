"""What a program run under Pulumi's mock engine declared, with lookups by type and name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stacks.mock_engine import ProgramRun, RecordedResource

GLOBAL_OUTPUTS = {
    "image_repository_urls": {"us-east-1": "111.dkr.ecr.us-east-1.amazonaws.com/llm"},
    "model_buckets": {"us-east-1": "models-use1"},
}


@dataclass
class Declared:
    """What a program declared, with lookups by type and name."""

    run: ProgramRun

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.run.resources if r.type == type_]

    def one(self, type_: str, name_part: str = "") -> RecordedResource:
        found = [r for r in self.of_type(type_) if name_part in r.name]
        assert len(found) == 1, f"expected one {type_} named *{name_part}*, got {found}"
        return found[0]

    def by_urn(self, urn: str) -> RecordedResource:
        return next(r for r in self.run.resources if r.urn == urn)

    def kubernetes(self, kind: str) -> list[dict[str, Any]]:
        return [r.inputs for r in self.run.resources if r.type.endswith(f":{kind}")]


Declare = Callable[..., Declared]
