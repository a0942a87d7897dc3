"""``response_format`` and ``structured_outputs`` → vLLM structured outputs, and validation of
what the engine returned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema_specifications import REGISTRY as METASCHEMAS

from runtime.frontend.errors import (
    IncompleteOutputError,
    InvalidOutputError,
    InvalidRequestError,
    TruncatedOutputError,
)
from runtime.frontend.schemas import ResponseFormat, StructuredOutputs

if TYPE_CHECKING:
    # Not exported; referencing's own annotations import it the same way.
    from referencing._core import Resolver

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SCHEMA_DEPTH",
    "ChoiceRequirement",
    "GrammarRequirement",
    "JsonRequirement",
    "OutputRequirement",
    "check_json_schema",
    "requirement_for",
    "schema_violation",
    "structured_outputs_value",
]

# Bounds that keep jsonschema's recursive checks (and json.dumps) far from Python's recursion
# limit, whatever the stack depth of the request that runs them.
MAX_JSON_DEPTH = 64
"""Arrays and objects nested in a client's schema document (``const``, ``enum`` included)."""
MAX_SCHEMA_DEPTH = 32
"""Subschemas nested in a client's schema, each ``$ref`` followed counting as one level."""

_SCHEMA_PARAM = "response_format.json_schema.schema"


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    # Never fetch: a client's $ref would otherwise make the pod GET any URL it names.
    # referencing's attrs classes are opaque to mypy (its _attrs.pyi predates PEP 681).
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


# Without a registry, jsonschema falls back to urlopen for every $ref it cannot resolve.
_REGISTRY: referencing.Registry[Any] = referencing.Registry(
    retrieve=_refuse_retrieval  # type: ignore[call-arg]
)


def _validator_class(schema: dict[str, Any]) -> type[jsonschema.protocols.Validator]:
    # An unknown $schema is validated as the latest draft, as jsonschema does (without its
    # deprecation warning).
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _nests_too_deep(value: Any) -> bool:
    """Whether arrays and objects nest past :data:`MAX_JSON_DEPTH` (counted without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


class _TooDeep(Exception):
    """A schema nests past :data:`MAX_SCHEMA_DEPTH`."""


class _BadReference(Exception):
    """A reference of the schema does not resolve within it."""

    def __init__(self, ref: str, error: referencing.exceptions.Unresolvable) -> None:
        super().__init__(ref)
        self.ref = ref
        self.error = error


def _check_references(
    schema: dict[str, Any], validator: type[jsonschema.protocols.Validator]
) -> None:
    """Resolve every reference the validator can reach, as it resolves them, counting depth.

    Raises ``_BadReference`` for a reference outside the schema (nothing is retrieved) or to a
    place that does not exist, and ``_TooDeep`` past :data:`MAX_SCHEMA_DEPTH`.
    """
    specification = referencing.jsonschema.specification_with(
        validator.ID_OF(validator.META_SCHEMA) or "urn:unknown-dialect",
        default=referencing.Specification.OPAQUE,
    )
    root = specification.create_resource(schema)
    registry = METASCHEMAS.combine(_REGISTRY)
    heights: dict[int, int] = {}
    on_path: set[int] = set()

    def height(contents: Any, resolver: Resolver[Any], depth: int, scoped: bool) -> int:
        # Longest chain of subschemas and references below ``contents`` (memoized per node; a
        # cycle counts once, as the instance that walks it bounds it). ``scoped``: the resolver
        # of a resolved reference already has the target's base URI (jsonschema's descend).
        if depth > MAX_SCHEMA_DEPTH:
            raise _TooDeep
        key = id(contents)
        if key in heights:
            if depth + heights[key] > MAX_SCHEMA_DEPTH:
                raise _TooDeep
            return heights[key]
        if key in on_path:
            return 0
        on_path.add(key)
        resource = specification.create_resource(contents)
        if not scoped:
            resolver = resolver.in_subresource(resource)
        below = 0
        if isinstance(contents, dict):
            for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = contents.get(keyword)
                if not isinstance(ref, str):
                    continue
                try:
                    resolved = resolver.lookup(ref)
                except referencing.exceptions.Unresolvable as exc:
                    raise _BadReference(ref, exc) from None
                target = height(resolved.contents, resolved.resolver, depth + 1, True)
                below = max(below, target + 1)
        for sub in resource.subresources():
            below = max(below, height(sub.contents, resolver, depth + 1, False) + 1)
        on_path.discard(key)
        heights[key] = below
        return below

    height(schema, registry.resolver_with_root(root), 0, False)


def check_json_schema(schema: dict[str, Any], param: str) -> None:
    """Raise :class:`InvalidRequestError` naming ``param`` unless the frontend can validate with
    ``schema``: a valid JSON Schema within the depth bounds whose references all resolve inside
    it (nothing is ever fetched)."""
    if _nests_too_deep(schema):
        raise InvalidRequestError(
            f"{param} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
            param=param,
        )
    if not isinstance(schema.get("$schema", ""), str):
        raise InvalidRequestError(f"{param}: $schema must be a URI string", param=param)
    validator = _validator_class(schema)
    try:
        # The metaschema check first: the reference walk relies on the schema's structure.
        validator.check_schema(schema)
        _check_references(schema, validator)
    except _TooDeep:
        raise InvalidRequestError(
            f"{param} nests subschemas (counting each $ref followed) more than "
            f"{MAX_SCHEMA_DEPTH} levels deep",
            param=param,
        ) from None
    except _BadReference as exc:
        raise InvalidRequestError(_unresolvable(param, exc.ref, exc.error), param=param) from None
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidRequestError(
            f"{param} is not a valid JSON Schema: {exc.message}", param=param
        ) from None


def _unresolvable(param: str, ref: str, error: referencing.exceptions.Unresolvable) -> str:
    if isinstance(
        error, referencing.exceptions.PointerToNowhere | referencing.exceptions.NoSuchAnchor
    ):
        return f"{param}: $ref {ref!r} points to nothing in the schema"
    return (
        f"{param}: $ref {ref!r} is not within the schema; references must be local "
        "(#/$defs/...), remote schemas are never fetched"
    )


def schema_violation(schema: dict[str, Any], value: Any) -> str | None:
    """Where and how ``value`` breaks ``schema`` (checked by :func:`check_json_schema`), or None.

    A reference that fails to resolve here raises ``Unresolvable``; nothing is fetched.
    """
    validator = _validator_class(schema)(schema, registry=_REGISTRY)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "(root)"
    return f"at {where}: {error.message}"


class OutputRequirement(Protocol):
    """What a response must satisfy, as the engine is asked to enforce it and as it is checked."""

    def spec(self) -> dict[str, Any]:
        """The ``StructuredOutputsParams`` fields vLLM takes for this requirement."""
        ...

    def validate(self, text: str, *, index: int, finish_reason: str | None = None) -> None:
        """Raise :class:`InvalidOutputError` unless ``text`` satisfies the requirement, and
        :class:`TruncatedOutputError` (a 400: the budget was the client's) where output that
        stopped at ``max_tokens`` does not."""
        ...


def _truncated(index: int, what: str) -> TruncatedOutputError:
    return TruncatedOutputError(
        f"choice {index} reached max_tokens before {what} was complete; the response was "
        "withheld: raise max_tokens",
        param="max_tokens",
        code="output_truncated",
    )


@dataclass(frozen=True)
class JsonRequirement:
    """Any JSON object (``schema`` None) or a document that satisfies a JSON Schema."""

    schema: dict[str, Any] | None
    param: str = "response_format"
    schema_param: str = _SCHEMA_PARAM

    def spec(self) -> dict[str, Any]:
        return {"json": self.schema} if self.schema is not None else {"json_object": True}

    def validate(self, text: str, *, index: int, finish_reason: str | None = None) -> None:
        try:
            value = json.loads(text)
        except RecursionError:
            raise self._too_deep(index) from None
        except json.JSONDecodeError as exc:
            if finish_reason == "length":
                raise _truncated(index, "its JSON") from None
            raise IncompleteOutputError(
                f"the engine returned invalid JSON for choice {index} ({exc.msg} at "
                f"position {exc.pos}); the response was withheld",
                param=self.param,
                code="invalid_json_output",
            ) from None
        if self.schema is None:
            if not isinstance(value, dict):
                raise InvalidOutputError(
                    f"choice {index} is JSON but not an object, as json_object requires",
                    param=self.param,
                    code="invalid_json_output",
                )
            return
        try:
            violation = schema_violation(self.schema, value)
        except referencing.exceptions.Unresolvable as exc:
            # check_json_schema resolved every reference already; this is its safety net.
            raise InvalidRequestError(
                _unresolvable(self.schema_param, exc.ref, exc), param=self.schema_param
            ) from None
        except RecursionError:
            raise self._too_deep(index) from None
        if violation is not None:
            raise InvalidOutputError(
                f"choice {index} does not satisfy the {self.param} schema {violation}",
                param=self.param,
                code="invalid_json_output",
            )

    def _too_deep(self, index: int) -> InvalidOutputError:
        return InvalidOutputError(
            f"choice {index} nests too deeply to be validated; the response was withheld",
            param=self.param,
            code="invalid_json_output",
        )


@dataclass(frozen=True)
class ChoiceRequirement:
    """Exactly one of ``choices`` (``structured_outputs.choice``)."""

    choices: tuple[str, ...]

    def spec(self) -> dict[str, Any]:
        return {"choice": list(self.choices)}

    def validate(self, text: str, *, index: int, finish_reason: str | None = None) -> None:
        if text in self.choices:
            return
        if finish_reason == "length":
            raise _truncated(index, "its choice")
        # Part of a choice is unfinished output; anything else is wrong output.
        unfinished = any(c.startswith(text) for c in self.choices)
        raise (IncompleteOutputError if unfinished else InvalidOutputError)(
            f"choice {index} is not one of structured_outputs.choice (the engine returned "
            f"{text[:80]!r}); the response was withheld",
            param="structured_outputs",
            code="invalid_choice_output",
        )


@dataclass(frozen=True)
class GrammarRequirement:
    """A regex or a grammar (``structured_outputs.regex``, ``.grammar``), which the engine
    compiles and enforces; there is no second implementation of its dialect here to check the
    output against, so the text is returned as the engine ends it (``length`` included)."""

    kind: Literal["regex", "grammar"]
    source: str

    def spec(self) -> dict[str, Any]:
        return {self.kind: self.source}

    def validate(self, text: str, *, index: int, finish_reason: str | None = None) -> None:
        return None


def requirement_for(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputs | None = None
) -> OutputRequirement | None:
    """The output requirement of a request, after checking what it sent."""
    if structured_outputs is not None:
        if response_format is not None and response_format.type != "text":
            raise InvalidRequestError(
                "response_format and structured_outputs both constrain the output; send one",
                param="structured_outputs",
            )
        return _structured_requirement(structured_outputs)
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return JsonRequirement(None)
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise InvalidRequestError(
            f"{_SCHEMA_PARAM} is required for type json_schema", param=_SCHEMA_PARAM
        )
    check_json_schema(spec.schema_, _SCHEMA_PARAM)
    return JsonRequirement(spec.schema_)


def _structured_requirement(value: StructuredOutputs) -> OutputRequirement:
    kinds = {
        "json": value.json_,
        "json_object": value.json_object,
        "regex": value.regex,
        "choice": value.choice,
        "grammar": value.grammar,
    }
    sent = [kind for kind, given in kinds.items() if given is not None]
    if len(sent) != 1:
        raise InvalidRequestError(
            f"structured_outputs takes exactly one of {', '.join(kinds)}; "
            f"got {', '.join(sent) or 'none'}",
            param="structured_outputs",
        )
    if value.json_ is not None:
        return JsonRequirement(
            _json_schema(value.json_), "structured_outputs", "structured_outputs.json"
        )
    if value.json_object is not None:
        if not value.json_object:
            raise InvalidRequestError(
                "structured_outputs.json_object=false asks for nothing; send true, or leave "
                "structured_outputs out",
                param="structured_outputs.json_object",
            )
        return JsonRequirement(None, "structured_outputs", "structured_outputs.json")
    if value.choice is not None:
        for i, choice in enumerate(value.choice):
            if not choice:
                raise InvalidRequestError(
                    f"structured_outputs.choice[{i}] is empty; every choice needs some text",
                    param="structured_outputs.choice",
                )
        return ChoiceRequirement(tuple(value.choice))
    if value.regex is not None:
        return GrammarRequirement("regex", value.regex)
    assert value.grammar is not None
    return GrammarRequirement("grammar", value.grammar)


def _json_schema(schema: dict[str, Any] | str) -> dict[str, Any]:
    """``structured_outputs.json``: a schema object, or JSON text of one (as vLLM takes it)."""
    param = "structured_outputs.json"
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (json.JSONDecodeError, RecursionError):
            raise InvalidRequestError(
                f"{param} is text that is not JSON; send the JSON Schema as an object",
                param=param,
            ) from None
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"{param} must be a JSON Schema object", param=param)
    check_json_schema(schema, param)
    return schema


def structured_outputs_value(spec: dict[str, Any]) -> str:
    """The backend takes the structured-output parameters as a JSON-encoded string."""
    return json.dumps(spec)
