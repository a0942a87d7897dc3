"""Incremental tool-call parsers, as vLLM's ``extract_tool_calls_streaming``.

Text goes in piece by piece; content and ``delta.tool_calls`` fragments come out. The
non-streamed response feeds the whole text through the same parser, so a stream adds up to it
by construction. Arguments are the JSON text the model wrote (validated once the call is
complete), as OpenAI returns them.

Over 400 lines on purpose: the base parser and the one model family's syntax it drives are read
together; another family's parser would go in a module of its own.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.frontend.errors import (
    IncompleteOutputError,
    InvalidOutputError,
    TruncatedOutputError,
)
from runtime.frontend.structured import schema_violation
from runtime.frontend.tools import ToolCall, ToolPlan

__all__ = [
    "CallDelta",
    "HermesToolStream",
    "NamedToolStream",
    "RequiredToolStream",
    "ToolDelta",
    "ToolStream",
    "tool_stream",
]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class CallDelta:
    """A fragment of one tool call: its id, type and name come with its first fragment."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict[str, Any]:
        """The ``choices[].delta.tool_calls[]`` item of a chat completion chunk."""
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is None:
            return {"index": self.index, "function": function}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, **function},
        }


@dataclass
class ToolDelta:
    """What a piece of output adds: content text and tool-call fragments (one per call)."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def extend(self, other: ToolDelta) -> ToolDelta:
        self.content += other.content
        for call in other.calls:
            last = self.calls[-1] if self.calls else None
            if last is not None and last.index == call.index and call.id is None:
                self.calls[-1] = replace(last, arguments=last.arguments + call.arguments)
            else:
                self.calls.append(call)
        return self


class _Malformed(Exception):
    """The output broke the tool-call format; the stream turns it into a typed error."""


class _Unfinished(_Malformed):
    """The output ended inside a forced call's JSON."""


_WS = " \t\n\r"


class _CallScanner:
    """Scans one JSON object char by char: the ``name`` string and the raw arguments value.

    The arguments come out as the model wrote them, character for character, as they arrive;
    the object as a whole is validated with ``json.loads`` once it is closed.
    """

    def __init__(self, arguments_key: str) -> None:
        self.arguments_key = arguments_key
        self.raw: list[str] = []
        self.name: str | None = None
        self.arguments: str | None = None
        self.done = False
        self._phase = "open"  # open, key, colon, value, in_value, after
        self._key: str | None = None
        self._token: list[str] = []
        self._kind = ""  # of the value being read: container, string, scalar
        self._depth = 0  # nesting inside a container value
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> tuple[int, str]:
        """Consume ``text`` up to the object's end; returns (chars used, arguments fragment)."""
        out: list[str] = []
        for used, ch in enumerate(text):
            if self.done:
                return used, "".join(out)
            self.raw.append(ch)
            # A scalar value ends at a delimiter, which then belongs to the object.
            if self._phase == "in_value" and self._value_char(ch, out):
                continue
            self._object_char(ch, out)
        return len(text), "".join(out)

    def _value_char(self, ch: str, out: list[str]) -> bool:
        """Feed one char of the value being read; False when it is not part of the value."""
        if self._kind == "scalar" and (ch in _WS or ch in ",}"):
            self._end_value()
            return False
        self._token.append(ch)
        if self._key == self.arguments_key:
            out.append(ch)
        if self._in_string:
            if self._string_char(ch) and self._kind == "string":
                self._end_value()
        elif ch == '"':
            self._in_string = True
        elif self._kind == "container" and ch in "{[":
            self._depth += 1
        elif self._kind == "container" and ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._end_value()
        return True

    def _object_char(self, ch: str, out: list[str]) -> None:
        phase = self._phase
        if phase == "key" and self._in_string:
            self._key_char(ch)
            return
        if ch in _WS:
            return
        if phase == "open" and ch == "{":
            self._phase = "key"
        elif phase == "key" and ch == '"':
            self._in_string, self._token = True, []
        elif phase in ("key", "after") and ch == "}":
            self.done = True
        elif phase == "colon" and ch == ":":
            self._phase = "value"
        elif phase == "after" and ch == ",":
            self._phase = "key"
        elif phase == "value" and ch not in ",}":
            self._phase, self._token, self._depth = "in_value", [], 0
            self._kind = "container" if ch in "{[" else "string" if ch == '"' else "scalar"
            self._value_char(ch, out)
        else:
            raise _Malformed(f"unexpected {ch!r} in a tool call")

    def _string_char(self, ch: str) -> bool:
        """Feed one char inside a JSON string, tracking escapes; True when it closes the string."""
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            return True
        return False

    def _key_char(self, ch: str) -> None:
        if not self._string_char(ch):
            self._token.append(ch)
            return
        try:
            self._key = json.loads('"' + "".join(self._token) + '"')
        except json.JSONDecodeError:
            raise _Malformed("a key in a tool call is not a valid JSON string") from None
        self._phase = "colon"

    def _end_value(self) -> None:
        raw = "".join(self._token)
        if self._key == "name":
            try:
                name = json.loads(raw)
            except json.JSONDecodeError:
                raise _Malformed("a tool call's name is not valid JSON") from None
            if not isinstance(name, str):
                raise _Malformed("a tool call's name is not a string")
            self.name = name
        elif self._key == self.arguments_key:
            self.arguments = raw
        self._phase = "after"

    def call(self, call_id: str) -> ToolCall:
        """The finished call, once the whole object parses as JSON with both members."""
        try:
            value = json.loads("".join(self.raw))
        except json.JSONDecodeError:
            raise _Malformed("a tool call is not valid JSON") from None
        if (
            not isinstance(value, dict)
            or self.name is None
            or value.get("name") != self.name
            or self.arguments is None
        ):
            raise _Malformed(f"a tool call needs a name and {self.arguments_key}")
        return ToolCall(call_id, self.name, self.arguments)


class ToolStream(abc.ABC):
    """Turns a choice's output into content and tool calls, incrementally.

    ``feed`` takes each new piece of text and returns what can be sent now; ``finish`` ends
    the output and raises the typed error if it broke the format. Feeding the whole text at
    once gives the non-streamed result, so a stream adds up to exactly that. A call to a
    function in ``strict`` must satisfy that parameters schema once it is complete.
    """

    def __init__(self, strict: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.strict = strict or {}
        self.calls: list[ToolCall] = []
        self._content: list[str] = []
        self._current: _CallScanner | None = None
        self._current_id: str | None = None
        self._pending_arguments = ""

    @property
    def content(self) -> str | None:
        return "".join(self._content) or None

    def feed(self, text: str) -> ToolDelta:
        try:
            delta = self._feed(text)
        except _Malformed as exc:
            raise self._malformed(str(exc)) from None
        self._content.append(delta.content)
        return delta

    def finish(self, finish_reason: str | None) -> ToolDelta:
        try:
            delta = self._finish(finish_reason)
        except _Malformed as exc:
            if finish_reason == "length":
                raise TruncatedOutputError(
                    "max_tokens ended a tool call before it was complete",
                    param="max_tokens",
                    code="output_truncated",
                ) from None
            error = self._malformed(str(exc))
            if isinstance(exc, _Unfinished):
                raise IncompleteOutputError(
                    error.message, param=error.param, code=error.code
                ) from None
            raise error from None
        self._content.append(delta.content)
        return delta

    def _complete(self, call: ToolCall) -> None:
        """Record a finished call; a strict function's arguments are checked as
        ``response_format`` output is: a mismatch withholds the response."""
        schema = self.strict.get(call.name)
        if schema is not None:
            try:
                violation = schema_violation(schema, json.loads(call.arguments))
            except RecursionError:
                violation = "at (root): the arguments nest too deeply to be validated"
            if violation is not None:
                raise InvalidOutputError(
                    f"the model's call to {call.name} does not satisfy its strict parameters "
                    f"schema {violation}; the response was withheld",
                    param="tools",
                    code="invalid_tool_call",
                )
        self.calls.append(call)

    @abc.abstractmethod
    def _feed(self, text: str) -> ToolDelta: ...

    @abc.abstractmethod
    def _finish(self, finish_reason: str | None) -> ToolDelta: ...

    @abc.abstractmethod
    def _malformed(self, detail: str) -> InvalidOutputError: ...

    def _scan(self, scanner: _CallScanner, text: str) -> tuple[int, ToolDelta]:
        """Feed ``scanner``; the call's first fragment (id, name) waits until the name is read."""
        used, fragment = scanner.feed(text)
        delta = ToolDelta()
        index = len(self.calls)
        self._pending_arguments += fragment
        if self._current_id is None and scanner.name is not None:
            self._current_id = _call_id()
            delta.calls.append(
                CallDelta(index, self._pending_arguments, self._current_id, scanner.name)
            )
            self._pending_arguments = ""
        elif self._current_id is not None and self._pending_arguments:
            delta.calls.append(CallDelta(index, self._pending_arguments))
            self._pending_arguments = ""
        if scanner.done:
            self._complete(scanner.call(self._current_id or _call_id()))
            self._current_id = None
        return used, delta


class HermesToolStream(ToolStream):
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks within the text.

    The last block may end without its ``</tool_call>`` once its call is complete; one whose
    JSON is unfinished is malformed. Content is the text outside the blocks; whitespace is
    held back until more content follows, so when the output makes calls the whitespace around
    them that ends it is dropped. Text that may begin a block is held back until it is decided.
    """

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, strict: Mapping[str, dict[str, Any]] | None = None) -> None:
        super().__init__(strict)
        self._text = ""  # undecided text
        self._space = ""  # whitespace held back until content follows
        self._state = "text"  # text, open (before the object), call, close

    def _content_piece(self, piece: str) -> str:
        body = piece.rstrip(_WS)
        if not body:
            self._space += piece
            return ""
        out = self._space + body
        self._space = piece[len(body) :]
        return out

    def _feed(self, text: str) -> ToolDelta:
        self._text += text
        delta = ToolDelta()
        while self._text:
            if self._state == "text":
                at = self._text.find(self.OPEN)
                if at < 0:
                    keep = _marker_prefix(self._text, self.OPEN)
                    delta.content += self._content_piece(self._text[: len(self._text) - keep])
                    self._text = self._text[len(self._text) - keep :]
                    return delta
                delta.content += self._content_piece(self._text[:at])
                self._text = self._text[at + len(self.OPEN) :]
                self._state = "open"
                self._current = _CallScanner("arguments")
            elif self._state in ("open", "call"):
                stripped = self._text.lstrip(_WS) if self._state == "open" else self._text
                if not stripped:
                    self._text = ""
                    return delta
                if self._state == "open" and stripped[0] != "{":
                    raise _Malformed("a <tool_call> block does not hold a JSON object")
                self._state = "call"
                assert self._current is not None
                used, piece = self._scan(self._current, stripped)
                delta.extend(piece)
                self._text = stripped[used:]
                if self._current.done:
                    self._state, self._current = "close", None
            else:
                stripped = self._text.lstrip(_WS)
                if stripped.startswith(self.CLOSE):
                    self._text = stripped[len(self.CLOSE) :]
                    self._state = "text"
                elif self.CLOSE.startswith(stripped):
                    self._text = stripped
                    return delta
                else:
                    raise _Malformed("a tool call is not followed by </tool_call>")
        return delta

    def _finish(self, finish_reason: str | None) -> ToolDelta:
        # A block whose call is complete stands without its </tool_call>, as vLLM's hermes
        # parser has it: the model may stop right after the JSON, or a stop sequence may take
        # the tag. The call is already recorded (and streamed); the start of a tag held back
        # in ``_feed`` is all that is left of the block here.
        if self._state == "close":
            self._state, self._text = "text", ""
        if self._state != "text":
            raise _Malformed("the output ended inside a <tool_call> block")
        content = self._content_piece(self._text)  # the start of a marker that never came
        if not self.calls:
            content += self._space
        self._text = self._space = ""
        return ToolDelta(content=content)

    def _malformed(self, detail: str) -> InvalidOutputError:
        return InvalidOutputError(
            f"the model wrote a malformed <tool_call> block: {detail}", code="invalid_tool_call"
        )


def _marker_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that ``marker`` starts with (0 if none)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class _ForcedToolStream(ToolStream):
    """Output forced by structured outputs; it must parse once complete."""

    def __init__(self, strict: Mapping[str, dict[str, Any]] | None = None) -> None:
        super().__init__(strict)
        self._text: list[str] = []

    def _check_json(self, finish_reason: str | None) -> Any:
        try:
            return json.loads("".join(self._text))
        except json.JSONDecodeError as exc:
            if finish_reason == "length":
                raise _Malformed("truncated") from None
            raise _Unfinished(exc.msg) from None

    def _malformed(self, detail: str) -> InvalidOutputError:
        return InvalidOutputError(
            f"the engine returned invalid JSON for a forced tool call: {detail}",
            param="tool_choice",
            code="invalid_json_output",
        )


class NamedToolStream(_ForcedToolStream):
    """``tool_choice`` names a function: the whole output is its arguments."""

    def __init__(self, name: str, strict: Mapping[str, dict[str, Any]] | None = None) -> None:
        super().__init__(strict)
        self.name = name
        self._id: str | None = None

    def _feed(self, text: str) -> ToolDelta:
        self._text.append(text)
        if self._id is None:
            self._id = _call_id()
            return ToolDelta(calls=[CallDelta(0, text, self._id, self.name)])
        return ToolDelta(calls=[CallDelta(0, text)] if text else [])

    def _finish(self, finish_reason: str | None) -> ToolDelta:
        delta = self._feed("") if self._id is None else ToolDelta()
        self._check_json(finish_reason)
        self._complete(ToolCall(self._id or _call_id(), self.name, "".join(self._text)))
        return delta


class RequiredToolStream(_ForcedToolStream):
    """``tool_choice: required``: the output is ``[{"name": ..., "parameters": ...}, ...]``."""

    def __init__(self, strict: Mapping[str, dict[str, Any]] | None = None) -> None:
        super().__init__(strict)
        self._state = "open"  # open, item, call, after, done

    def _feed(self, text: str) -> ToolDelta:
        self._text.append(text)
        delta = ToolDelta()
        while text:
            if self._state == "call":
                assert self._current is not None
                used, piece = self._scan(self._current, text)
                delta.extend(piece)
                text = text[used:]
                if self._current.done:
                    self._state, self._current = "after", None
                continue
            ch, text = text[0], text[1:]
            if ch in _WS:
                continue
            if self._state == "open" and ch == "[":
                self._state = "item"
            elif self._state == "item" and ch == "{":
                self._state, self._current = "call", _CallScanner("parameters")
                text = ch + text
            elif self._state == "after" and ch == ",":
                self._state = "item"
            elif self._state == "after" and ch == "]":
                self._state = "done"
            else:
                raise _Malformed(f"unexpected {ch!r} in the list of tool calls")
        return delta

    def _finish(self, finish_reason: str | None) -> ToolDelta:
        self._check_json(finish_reason)
        if self._state != "done" or not self.calls:
            raise _Malformed("expected a non-empty list of tool calls")
        return ToolDelta()


def tool_stream(plan: ToolPlan) -> ToolStream | None:
    """The parser a request's tool plan needs, or ``None`` when its output is plain text."""
    if plan.forced_name is not None:
        return NamedToolStream(plan.forced_name, plan.strict)
    if plan.forced is not None:
        return RequiredToolStream(plan.strict)
    if plan.parse:
        return HermesToolStream(plan.strict)
    return None
