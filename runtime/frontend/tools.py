"""Tool calling: the tools a template sees and the forced-call schemas.

The model's output is turned into calls by :mod:`runtime.frontend.tool_parsers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.frontend.errors import FieldRefusedError, InvalidRequestError
from runtime.frontend.schemas import FunctionTool, NamedToolChoice
from runtime.frontend.structured import check_json_schema

__all__ = ["ToolCall", "ToolPlan", "plan_tools"]


@dataclass(frozen=True)
class ToolCall:
    """One complete call; ``arguments`` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools are honoured.

    ``template_tools`` go to the chat template; ``forced`` is a structured-output JSON schema
    when a call is required (``forced_name`` set when one function is named); ``parse`` means
    the output is scanned for calls the model chose to make. ``strict`` maps the functions
    sent with ``strict: true`` to the parameters schema each call's arguments must satisfy.
    """

    template_tools: list[dict[str, Any]] | None
    forced: dict[str, Any] | None = None
    forced_name: str | None = None
    parse: bool = False
    strict: Mapping[str, dict[str, Any]] = field(default_factory=dict)


def _params(tool: FunctionTool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def _strict(tools: list[FunctionTool]) -> dict[str, dict[str, Any]]:
    """Check every parameters schema (forced calls send it to the engine, strict ones are
    validated here) and map each strict function to its schema."""
    strict = {}
    for i, tool in enumerate(tools):
        if tool.function.parameters is not None:
            check_json_schema(tool.function.parameters, f"tools[{i}].function.parameters")
        if tool.function.strict:
            strict[tool.function.name] = _params(tool)
    return strict


def plan_tools(
    tools: list[FunctionTool] | None,
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None,
    parser: str | None,
    parallel: bool = True,
) -> ToolPlan:
    """Decide how ``tools``/``tool_choice`` (and ``parallel_tool_calls``) are honoured, or
    refuse them."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return ToolPlan(None)
    if parser is None:
        raise InvalidRequestError(
            "field 'tools' is refused: no tool-call parser is configured for this model "
            "(LLM_SERVING_FRONTEND_TOOL_CALL_PARSER)",
            param="tools",
            code="unsupported_field",
        )
    rendered = [t.model_dump(exclude_none=True) for t in tools]
    if tool_choice == "none":
        return ToolPlan(None)
    strict = _strict(tools)
    if tool_choice is None or tool_choice == "auto":
        if not parallel:
            # vLLM keeps the first call and drops the rest; that would drop calls silently.
            raise FieldRefusedError(
                "parallel_tool_calls",
                "with tool_choice auto the model cannot be limited to one tool call; send true, "
                'or name the function in tool_choice (or send "required")',
            )
        return ToolPlan(rendered, parse=True, strict=strict)
    if tool_choice == "required":
        calls: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "name": {"const": t.function.name},
                            "parameters": _params(t),
                        },
                        "required": ["name", "parameters"],
                    }
                    for t in tools
                ]
            },
        }
        if not parallel:
            calls["maxItems"] = 1
        return ToolPlan(rendered, forced=calls, strict=strict)
    name = tool_choice.function.name
    match = [t for t in tools if t.function.name == name]
    if not match:
        raise InvalidRequestError(
            f"tool_choice names function {name!r}, which is not in tools",
            param="tool_choice",
        )
    return ToolPlan(rendered, forced=_params(match[0]), forced_name=name, strict=strict)
