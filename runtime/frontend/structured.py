"""``response_format`` → vLLM structured outputs, and validation of what the engine returned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from runtime.frontend.errors import InvalidOutputError, InvalidRequestError, TruncatedOutputError
from runtime.frontend.schemas import ResponseFormat

__all__ = ["JsonRequirement", "requirement_for", "structured_outputs_value"]


@dataclass(frozen=True)
class JsonRequirement:
    """What a response must satisfy: any JSON object (``schema`` None) or a JSON Schema."""

    schema: dict[str, Any] | None

    def spec(self) -> dict[str, Any]:
        """The ``StructuredOutputsParams`` fields vLLM takes for this requirement."""
        return {"json": self.schema} if self.schema is not None else {"json_object": True}

    def validate(self, text: str, *, index: int, finish_reason: str | None = None) -> None:
        """Raise :class:`InvalidOutputError` unless ``text`` is JSON satisfying the requirement.

        Output that stopped at ``max_tokens`` raises :class:`TruncatedOutputError` (a 400: the
        budget was the client's) instead.
        """
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if finish_reason == "length":
                raise TruncatedOutputError(
                    f"choice {index} reached max_tokens before its JSON was complete; the "
                    "response was withheld: raise max_tokens",
                    param="max_tokens",
                    code="output_truncated",
                ) from None
            raise InvalidOutputError(
                f"the engine returned invalid JSON for choice {index} ({exc.msg} at "
                f"position {exc.pos}); the response was withheld",
                param="response_format",
                code="invalid_json_output",
            ) from None
        if self.schema is None:
            if not isinstance(value, dict):
                raise InvalidOutputError(
                    f"choice {index} is JSON but not an object, as json_object requires",
                    param="response_format",
                    code="invalid_json_output",
                )
            return
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.schema)(self.schema).iter_errors(value)
        )
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "(root)"
            raise InvalidOutputError(
                f"choice {index} does not satisfy the response_format schema at {where}: "
                f"{error.message}",
                param="response_format",
                code="invalid_json_output",
            )


def requirement_for(response_format: ResponseFormat | None) -> JsonRequirement | None:
    """The JSON requirement of a request, after checking the schema it sent."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return JsonRequirement(None)
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise InvalidRequestError(
            "response_format.json_schema.schema is required for type json_schema",
            param="response_format.json_schema.schema",
        )
    try:
        jsonschema.validators.validator_for(spec.schema_).check_schema(spec.schema_)
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidRequestError(
            f"response_format.json_schema.schema is not a valid JSON Schema: {exc.message}",
            param="response_format.json_schema.schema",
        ) from None
    return JsonRequirement(spec.schema_)


def structured_outputs_value(spec: dict[str, Any]) -> str:
    """The backend takes the structured-output parameters as a JSON-encoded string."""
    return json.dumps(spec)
