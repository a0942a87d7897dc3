"""Request shapes of the OpenAI routes this frontend serves (pydantic, unknown fields forbidden).

Fields the frontend refuses are still declared (typed loosely) so that the field table, not the
parser, decides and says why; every declared field has exactly one row in
:mod:`runtime.frontend.fields`.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

__all__ = [
    "MAX_EMBEDDING_INPUTS",
    "AssistantToolCall",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "EmbeddingRequest",
    "FunctionTool",
    "JsonSchemaFormat",
    "NamedToolChoice",
    "ResponseFormat",
    "ScoreRequest",
    "StreamOptions",
    "StructuredOutputs",
    "TokenizeRequest",
]


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (keys included) has no UTF-8 form."""
    try:
        # orjson refuses such strings at native speed: a 4 MiB token machine in about 7 ms,
        # against about 200 ms of the walk below, on the event loop.
        orjson.dumps(value)
        return False
    except TypeError:  # a surrogate, or what orjson does not encode (a model, a big int)
        pass
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _utf8(cls, value: Any) -> Any:
        # JSON escapes can spell lone surrogates ("\ud800"), which no tokenizer or gRPC
        # string takes; nested models check their own fields.
        if _has_lone_surrogate(value):
            raise ValueError(
                "is not UTF-8 text: it holds a lone UTF-16 surrogate (\\ud800-\\udfff)"
            )
        return value


class ContentPart(_Strict):
    """One part of a message's content. Only text parts are rendered; other kinds (images,
    audio, files) are parsed so that the refusal names the part and its type."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


_CONTENT_PARTS = TypeAdapter(list[ContentPart])


class CalledFunction(_Strict):
    name: str
    arguments: str = Field(description="The JSON text the model wrote, as OpenAI returns it.")


class AssistantToolCall(_Strict):
    """A tool call of an assistant turn the client replays."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Strict):
    """One conversation turn; only text content is accepted."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: str | None = None
    # Sent back by SDKs when a conversation is replayed; must be empty (see the field table).
    refusal: str | None = None
    # The rest of an SDK response message, as message.model_dump() replays it: only null (or no
    # annotations) carries nothing to drop.
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    @field_validator("content", mode="wrap")
    @classmethod
    def _content(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Errors name the part (content.0.text), not each member of the union (content.str).
        if isinstance(value, list):
            return _CONTENT_PARTS.validate_python(value)
        if value is None or isinstance(value, str):
            return handler(value)
        raise ValueError("send a string, a list of content parts, or null")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class JsonSchemaFormat(_Strict):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs`` request field: one kind of output the engine enforces."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = Field(
        default=None, description="Extension (vLLM): usage so far on every chunk."
    )


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


class _Sampling(_Strict):
    """Fields shared by chat and text completions."""

    model: str
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=128)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stream_interval: int | None = Field(
        default=None,
        ge=1,
        description="Extension (vLLM's own field): tokens per streamed chunk, the first at once.",
    )
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    constraints: dict[str, Any] | None = Field(
        default=None,
        description="Extension: per-request decoding constraints (runtime.constraints.schema).",
    )
    # vLLM's own sampling fields, as its OpenAI server takes them.
    top_k: int | None = Field(
        default=None, ge=-1, description="Extension (vLLM): sample from the k likeliest tokens."
    )
    min_p: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Extension (vLLM): drop tokens below this share of the likeliest one's.",
    )
    repetition_penalty: float | None = Field(
        default=None,
        gt=0.0,
        allow_inf_nan=False,
        description="Extension (vLLM): above 1 discourages tokens of the prompt and output.",
    )
    min_tokens: int | None = Field(
        default=None, ge=0, description="Extension (vLLM): no end of sequence before this many."
    )
    stop_token_ids: list[int] | None = Field(
        default=None, description="Extension (vLLM): token ids that end the output."
    )
    ignore_eos: bool | None = Field(
        default=None, description="Extension (vLLM): generate past end of sequence."
    )
    include_stop_str_in_output: bool | None = Field(
        default=None, description="Extension (vLLM): keep the matched stop string."
    )
    allowed_token_ids: list[int] | None = Field(
        default=None, min_length=1, description="Extension (vLLM): the only tokens sampled."
    )
    bad_words: list[str] | None = Field(
        default=None, description="Extension (vLLM): words whose tokens are never sampled."
    )
    skip_special_tokens: bool | None = Field(
        default=None, description="Extension (vLLM): leave special tokens out of the text."
    )
    spaces_between_special_tokens: bool | None = Field(
        default=None,
        description="Extension (vLLM): a space between special tokens in the text (slow "
        "tokenizers only).",
    )
    return_token_ids: bool | None = Field(
        default=None,
        description="Extension (vLLM): the prompt's and each choice's token ids.",
    )
    request_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="Extension (vLLM): the response's id, after its prefix.",
    )
    cache_salt: str | None = Field(
        default=None,
        min_length=1,
        description="Extension (vLLM): only requests with the same salt share prefix-cached "
        "prompt blocks.",
    )
    prompt_logprobs: int | None = Field(
        default=None,
        ge=0,
        description="Extension (vLLM): each prompt token's log-probability, with this many "
        "alternatives.",
    )
    return_tokens_as_token_ids: bool | None = Field(
        default=None, description="Extension (vLLM): logprobs name each token token_id:N."
    )
    priority: int | None = Field(
        default=None, description="Extension (vLLM): scheduling priority; 0 only here."
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None,
        description="Extension (vLLM): output the engine constrains to a JSON Schema, a JSON "
        "object, a regex, one of a list of choices, or a grammar.",
    )


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    audio: Any | None = None
    function_call: Any | None = None
    functions: Any | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    parallel_tool_calls: bool | None = None
    prediction: Any | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    tools: list[FunctionTool] | None = None
    verbosity: str | None = None
    web_search_options: Any | None = None
    # vLLM's own chat-template fields, as its OpenAI server takes them.
    add_generation_prompt: bool | None = Field(
        default=None,
        description="Extension (vLLM): end the prompt with the assistant's turn (default true).",
    )
    continue_final_message: bool | None = Field(
        default=None,
        description="Extension (vLLM): leave the last message open for the model to continue.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="Extension (vLLM): further variables the model's chat template reads.",
    )

    @field_validator("tool_choice", mode="wrap")
    @classmethod
    def _tool_choice(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # One error naming tool_choice, not one per member of the union.
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(
                'send "none", "auto", "required" or '
                '{"type": "function", "function": {"name": "..."}}'
            ) from None


#: The most inputs one embeddings request takes (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048


def _one_prompt_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    # One error naming the field, not one per member of the union (prompt.str, ...).
    try:
        return handler(value)
    except ValidationError as exc:
        if exc.error_count() == 1:  # the value took a shape, and failed a check of it
            raise
        raise ValueError(
            "send a string, a list of strings, a list of token ids, or a list of token-id lists"
        ) from None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 with echo returns the prompt alone (scoring it with logprobs), as in vLLM and OpenAI.
    max_tokens: int | None = Field(default=None, ge=0)
    best_of: int | None = Field(default=None, ge=1, le=20)
    echo: bool | None = None
    response_format: ResponseFormat | None = Field(
        default=None, description="Extension (vLLM): chat's response_format, on completions."
    )
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None

    _prompt = field_validator("prompt", mode="wrap")(_one_prompt_error)


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings``."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _input(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # A list of ints is one input; a list of texts or of token lists is several.
        many = isinstance(value, list) and value and not isinstance(value[0], int)
        if many and len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs, as OpenAI takes; split them")
        return _one_prompt_error(value, handler)


class ScoreRequest(_Strict):
    """``POST /v1/score``: log-probabilities of candidate continuations of one prompt."""

    model: str
    prompt: str = Field(min_length=1, description="The shared context.")
    candidates: list[str] = Field(
        min_length=1, max_length=256, description="Continuations to score, appended to prompt."
    )
    user: str | None = None


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's route): a ``prompt``, or chat ``messages`` rendered as chat
    completions render them."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[FunctionTool] | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` (vLLM's route): token ids back to text."""

    model: str
    tokens: list[int]
