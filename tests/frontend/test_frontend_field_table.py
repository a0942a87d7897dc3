"""One test per row of the field table: honoured fields reach the backend, inert ones change
nothing, refused ones are a 400 naming the field. A row without a case fails.

Each row runs against real Triton on the real engine (the tiny Llama; what the frontend sent is
recorded on its way out, and real vLLM must accept it) and against the KServe stand-in, whose
toy model makes exact outputs checkable (a word per token, scripted structured output)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessage

from runtime.frontend.fields import TABLES, Policy, render_markdown
from runtime.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ScoreRequest,
    TokenizeRequest,
)
from tests.frontend.conftest import LOOKUP_TOOL, Served
from tests.support import toy_model

MODEL = "toy-llm"
CHAT, COMPLETIONS, EMBEDDINGS, SCORE, TOKENIZE, DETOKENIZE = TABLES
HI = [{"role": "user", "content": "hi"}]
BASE: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "messages": HI, "max_tokens": 3},
    COMPLETIONS: {"model": MODEL, "prompt": "the cat", "max_tokens": 3},
    EMBEDDINGS: {"model": MODEL, "input": "the cat"},
    SCORE: {"model": MODEL, "prompt": "the cat", "candidates": [" sat", " ran far"]},
    TOKENIZE: {"model": MODEL, "prompt": "the cat"},
    DETOKENIZE: {"model": MODEL, "tokens": [1, 2]},
}


class Probe:
    """Posts a route's base body plus some fields and reads what the stand-in received."""

    def __init__(self, served: Served, route: str) -> None:
        self.served = served
        self.route = route

    @property
    def real(self) -> bool:
        return self.served.real

    def tokens(self, text: str) -> list[int]:
        """``text``'s token ids under the served tokenizer (what the backend counts)."""
        return self.served.state.tokenizer.encode(text, add_special_tokens=False).ids

    def post(self, **fields: Any) -> httpx.Response:
        body = {**BASE[self.route], **fields}
        return httpx.post(self.served.url + self.route, json=body, timeout=30)

    def ok(self, **fields: Any) -> dict[str, Any]:
        response = self.post(**fields)
        assert response.status_code == 200, response.text
        return response.json()

    def sent(self, **fields: Any) -> dict[str, Any]:
        self.ok(**fields)
        return self.served.requests[-1].sampling_parameters

    def last(self):
        return self.served.requests[-1]

    def refused(self, field: str, **fields: Any) -> None:
        response = self.post(**fields)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and field in error["message"]
        assert error["type"] == "invalid_request_error"

    def inert(self, **fields: Any) -> None:
        baseline = self.sent()
        base_text = self.last().text_input
        assert self.sent(**fields) == baseline
        assert self.last().text_input == base_text


Case = Callable[[Probe], None]
CASES: dict[tuple[str, str], Case] = {}


def case(route: str | tuple[str, ...], field: str) -> Callable[[Case], Case]:
    routes = (route,) if isinstance(route, str) else route

    def register(fn: Case) -> Case:
        for r in routes:
            CASES[(r, field)] = fn
        return fn

    return register


GEN = (CHAT, COMPLETIONS)


def _partial_utf8_token(p: Probe) -> int:
    """A token of the served vocabulary that is not UTF-8 on its own (it decodes to U+FFFD)."""
    tokenizer = p.served.state.tokenizer
    for token_id in range(tokenizer.get_vocab_size()):
        if tokenizer.decode([token_id]) == "\ufffd":
            return token_id
    raise AssertionError("the vocabulary has no partial UTF-8 token")


def _named_bytes(name: str) -> bytes:
    """The bytes an OpenAI ``bytes:\\xNN...`` token name spells (not such a name: an error)."""
    assert name.startswith("bytes:\\x"), name
    return bytes.fromhex(name.removeprefix("bytes:").replace("\\x", ""))


ALL = (CHAT, COMPLETIONS, EMBEDDINGS, SCORE)


def _sse(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON events of a streamed response, ``[DONE]`` checked and left out."""
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _as_text(decoded: str, text: str) -> bool:
    """Whether tokens that decode to ``decoded`` are the output ``text``: vLLM's text leaves out
    the bytes at its end that do not complete a character yet (each decodes to U+FFFD)."""
    return decoded == text or decoded.rstrip("\ufffd") == text


def _text(probe: Probe, reply: dict[str, Any], i: int = 0) -> str:
    choice = reply["choices"][i]
    return choice["message"]["content"] if probe.route == CHAT else choice["text"]


@case(CHAT, "messages")
def _(p: Probe) -> None:
    p.ok(messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "yo"}])
    assert p.last().text_input.startswith("<|im_start|>system\nbe brief<|im_end|>\n")
    p.refused(
        "messages[0].refusal", messages=[{"role": "assistant", "content": "", "refusal": "x"}]
    )
    parts = [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]
    p.ok(messages=[{"role": "system", "content": parts}, {"role": "user", "content": "yo"}])
    assert p.last().text_input.startswith("<|im_start|>system\nbe brief<|im_end|>\n")
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    p.refused("messages[0].content[1]", messages=[{"role": "user", "content": [parts[0], image]}])
    p.refused(
        "messages[0].content[0].cache_control",
        messages=[{"role": "user", "content": [{**parts[0], "cache_control": {}}]}],
    )
    p.refused("messages[0].content", messages=[{"role": "user"}])
    p.refused("messages[1].content", messages=[{"role": "user", "content": "x"}, {"role": "tool"}])
    # An SDK response message replayed as message.model_dump() writes its empty fields as null.
    replayed = ChatCompletionMessage(role="assistant", content="hi").model_dump()
    p.ok(messages=[{"role": "user", "content": "yo"}, replayed])
    p.refused("messages[0].audio", messages=[{**replayed, "audio": {"id": "audio_1"}}])
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    p.refused(
        "messages[0].tool_calls", messages=[{"role": "user", "content": "x", "tool_calls": [call]}]
    )
    p.refused(
        "messages[1].tool_call_id",
        messages=[
            {"role": "user", "content": "x"},
            {"role": "user", "content": "y", "tool_call_id": "c1"},
        ],
    )


@case((*ALL, TOKENIZE, DETOKENIZE), "model")
def _(p: Probe) -> None:
    p.ok()
    response = p.post(model="other")
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


@case(GEN, "frequency_penalty")
def _(p: Probe) -> None:
    assert p.sent(frequency_penalty=0.5)["frequency_penalty"] == 0.5


@case(GEN, "presence_penalty")
def _(p: Probe) -> None:
    assert p.sent(presence_penalty=-0.5)["presence_penalty"] == -0.5


@case(GEN, "logit_bias")
def _(p: Probe) -> None:
    # A plain token of each vocabulary: "cat" (toy), "at" (the tiny Llama's byte-level BPE).
    token = 290 if p.real else 3
    reply = p.ok(logit_bias={str(token): 100}, temperature=0)
    assert p.last().sampling_parameters["logit_bias"] == {str(token): 100.0}
    text = _text(p, reply)
    assert p.tokens(text) == [token] * 3, text
    p.refused("logit_bias", logit_bias={"cat": 1})
    vocabulary = p.served.state.tokenizer.get_vocab_size()
    p.refused("logit_bias", logit_bias={str(vocabulary): 1})
    p.refused("logit_bias", logit_bias={"3": 101})


@case(GEN, "max_tokens")
def _(p: Probe) -> None:
    no_eos = {"logit_bias": {"0": -100}} if p.real else {}  # the tiny Llama's <|eos|> is 0
    reply = p.ok(max_tokens=7, temperature=0, **no_eos)
    assert p.last().sampling_parameters["max_tokens"] == 7
    assert reply["usage"]["completion_tokens"] == 7
    p.refused("max_tokens", max_tokens=10_000)


@case(GEN, "n")
def _(p: Probe) -> None:
    reply = p.ok(n=3)
    assert p.last().sampling_parameters["n"] == 3 and len(reply["choices"]) == 3
    assert len({_text(p, reply, i) for i in range(3)}) == 3


@case(GEN, "seed")
def _(p: Probe) -> None:
    first, second = p.ok(seed=7, temperature=1), p.ok(seed=7, temperature=1)
    assert p.last().sampling_parameters["seed"] == 7
    assert _text(p, first) == _text(p, second) != _text(p, p.ok(seed=8, temperature=1))


@case(GEN, "stop")
def _(p: Probe) -> None:
    free = p.ok(max_tokens=8, temperature=0)
    words = _text(p, free).split()
    # A stop word that does not occur in the text before it.
    at = next(i for i in range(1, 8) if words[i] not in " ".join(words[:i]))
    reply = p.ok(max_tokens=8, temperature=0, stop=[words[at]])
    assert p.last().sampling_parameters["stop"] == [words[at]]
    assert _text(p, reply).split() == words[:at]
    # vLLM's stop_reason names the stop string that matched (null when no stop sequence did).
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["choices"][0]["stop_reason"] == words[at]
    assert free["choices"][0]["stop_reason"] is None
    streamed = _sse(p.post(max_tokens=8, temperature=0, stop=[words[at]], stream=True))
    ending = [c for e in streamed for c in e["choices"] if "stop_reason" in c]
    assert [(c["finish_reason"], c["stop_reason"]) for c in ending] == [("stop", words[at])]

    # The engine applies stop sequences to constrained output too; one that cuts it short is the
    # client's to fix, like max_tokens (a 400), not invalid output from the engine (a 502).
    schema = {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"]}
    strict = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": schema}}
    cut_short = (
        {"structured_outputs": {"choice": ["alpha beta"]}, "stop": ["beta"]},
        {"response_format": strict, "stop": ['"']},
    )
    for fields in cut_short:
        _stopped(p.post(max_tokens=16, **fields))
        _stopped(p.post(max_tokens=16, stream=True, **fields))
    if p.route == CHAT:
        named = {"type": "function", "function": {"name": "lookup"}}
        forced = {"tools": [LOOKUP_TOOL], "tool_choice": named, "max_tokens": 90, "temperature": 0}
        _stopped(p.post(stop=['"'], **forced))
        assert p.ok(stop=["never in JSON"], **forced)["choices"][0]["finish_reason"] == "tool_calls"


def _stopped(response: httpx.Response, param: str = "stop") -> None:
    """``response`` is the 400 ``output_stopped``, or a stream that ends with its error event
    (one whose output failed only after its first chunk went out)."""
    if response.headers["content-type"].startswith("text/event-stream"):
        events = response.text.split("\n\n")
        error = json.loads(events[-2].removeprefix("data: "))["error"]
    else:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
    assert error["code"] == "output_stopped" and error["param"] == param, error


@case(GEN, "stream")
def _(p: Probe) -> None:
    response = p.post(stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    # One chunk a token, unless outputs waiting together leave as one (coalesce.py) or a token
    # ends inside a UTF-8 sequence (the real engine's detokenizer holds it back).
    assert 2 <= len(events) <= 1 + 3 if p.real else len(events) == 1 + 3
    assert p.last().flags["stream"] is True


@case(GEN, "stream_options")
def _(p: Probe) -> None:
    response = p.post(stream=True, stream_options={"include_usage": True})
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] > 0
    p.refused("stream_options", stream=True, stream_options={"include_obfuscation": True})
    assert p.post(stream_options={"include_usage": True}).status_code == 400

    # continuous_usage_stats: each chunk's usage counts the tokens streamed up to it.
    no_eos = {"logit_bias": {"0": -100}} if p.real else {}
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"stream": True, "max_tokens": 6, "temperature": 0, "stream_options": options}
    events = _sse(p.post(**body, **no_eos))
    assert all(e["usage"] is not None for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 6, counts
    assert events[-1]["usage"] == events[-2]["usage"]
    assert {e["usage"]["prompt_tokens"] for e in events} == {usage["prompt_tokens"]}
    p.refused("stream_options", stream=True, stream_options={"continuous_usage_stats": True})


@case(GEN, "stream_interval")
def _(p: Probe) -> None:
    no_eos = {"logit_bias": {"0": -100}} if p.real else {}  # the tiny Llama's <|eos|> is 0
    body = {"stream": True, "max_tokens": 12, "temperature": 0, **no_eos}
    body["stream_options"] = {"include_usage": True}

    def texts(response: httpx.Response) -> list[str]:
        events = _sse(response)
        assert events[-1]["usage"]["completion_tokens"] == 12
        pieces = [
            (c["delta"].get("content") or "") if p.route == CHAT else c["text"]
            for e in events
            for c in e["choices"]
        ]
        return [piece for piece in pieces if piece]

    each = texts(p.post(**body))
    batched = texts(p.post(**body, stream_interval=4))
    assert p.last().sampling_parameters["stream_interval"] == 4
    assert "".join(batched) == "".join(each)
    if p.real:
        # The first token at once, then four a response: at most 1, 5, 9 and 12 tokens.
        assert len(batched) <= 4, batched
    p.refused("stream_interval", stream=True, stream_interval=0)


@case(GEN, "temperature")
def _(p: Probe) -> None:
    assert p.sent(temperature=0.25)["temperature"] == 0.25


@case(GEN, "top_p")
def _(p: Probe) -> None:
    assert p.sent(top_p=0.5)["top_p"] == 0.5


@case(ALL, "user")
def _(p: Probe) -> None:
    if p.route in GEN:
        p.inert(user="someone")
    else:
        p.ok(user="someone")
        baseline = p.ok()
        assert p.ok(user="x")["data"] == baseline["data"]


@case(GEN, "constraints")
def _(p: Probe) -> None:
    spec = {"version": 1, "banned_tokens": [5]}
    assert p.sent(constraints=spec)["extra_args"] == {"constraints": spec}
    bad = {"version": 1, "item_list": {"catalog": "c", "max_items": 0}}
    response = p.post(constraints=bad)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "constraints.item_list.max_items"


# A plain token of each vocabulary ("at" of the tiny Llama, "cat" of the toy) and end of sequence
# (token 0 of both), forced or banned with logit_bias.
def _plain_token(p: Probe) -> int:
    return 290 if p.real else 3


EOS = "0"
JSON_OBJECT = {"type": "json_object"}


def _refused_beside_grammar(p: Probe, field: str, **fields: Any) -> None:
    """``fields`` are a 400 naming ``field`` beside constraints, and beside structured outputs."""
    p.refused(field, constraints={"version": 1, "banned_tokens": [5]}, **fields)
    p.refused(field, structured_outputs={"choice": ["yes"]}, **fields)
    p.refused(field, response_format=JSON_OBJECT, **fields)


def _same_as_greedy(p: Probe, **narrowing: Any) -> None:
    """Sampling narrowed by ``narrowing`` to the likeliest token gives the greedy text, where
    plain sampling does not."""
    greedy = _text(p, p.ok(max_tokens=6, temperature=0))
    sampled = [_text(p, p.ok(max_tokens=6, temperature=1, seed=s)) for s in range(3)]
    assert any(text != greedy for text in sampled), sampled
    for s in range(3):
        assert _text(p, p.ok(max_tokens=6, temperature=1, seed=s, **narrowing)) == greedy


@case(GEN, "top_k")
def _(p: Probe) -> None:
    _same_as_greedy(p, top_k=1)
    assert p.last().sampling_parameters["top_k"] == 1
    p.refused("top_k", top_k=-2)


@case(GEN, "min_p")
def _(p: Probe) -> None:
    if p.real:  # the toy's logits tie too often for min_p=1 to keep one token
        _same_as_greedy(p, min_p=1.0)
    assert p.sent(min_p=1.0)["min_p"] == 1.0
    p.refused("min_p", min_p=1.5)


@case(GEN, "repetition_penalty")
def _(p: Probe) -> None:
    def generated(**fields: Any) -> list[int]:
        reply = p.ok(max_tokens=16, temperature=0, logit_bias={EOS: -100}, **fields)
        return p.tokens(_text(p, reply))

    repeats = generated()
    assert len(set(repeats)) < len(repeats), repeats
    penalized = generated(repetition_penalty=100.0)
    assert p.last().sampling_parameters["repetition_penalty"] == 100.0
    assert len(set(penalized)) == len(penalized), penalized
    p.refused("repetition_penalty", repetition_penalty=0)


@case(GEN, "min_tokens")
def _(p: Probe) -> None:
    assert p.ok(logit_bias={EOS: 100})["usage"]["completion_tokens"] == 1
    reply = p.ok(logit_bias={EOS: 100}, min_tokens=2)
    assert p.last().sampling_parameters["min_tokens"] == 2
    assert reply["usage"]["completion_tokens"] == 3
    assert reply["choices"][0]["finish_reason"] == "stop"
    p.refused("min_tokens", min_tokens=4)  # above max_tokens
    _refused_beside_grammar(p, "min_tokens", min_tokens=1)


@case(GEN, "ignore_eos")
def _(p: Probe) -> None:
    reply = p.ok(logit_bias={EOS: 100}, ignore_eos=True)
    assert p.last().sampling_parameters["ignore_eos"] is True
    assert reply["usage"]["completion_tokens"] == 3
    assert reply["choices"][0]["finish_reason"] == "length"
    _refused_beside_grammar(p, "ignore_eos", ignore_eos=True)


@case(GEN, "stop_token_ids")
def _(p: Probe) -> None:
    token = _plain_token(p)
    forced = {"temperature": 0, "logit_bias": {str(token): 100}}
    assert p.tokens(_text(p, p.ok(**forced))) == [token] * 3
    reply = p.ok(stop_token_ids=[token], **forced)
    assert p.last().sampling_parameters["stop_token_ids"] == [token]
    assert _text(p, reply) == "" and reply["choices"][0]["finish_reason"] == "stop"
    assert reply["choices"][0]["stop_reason"] == token
    p.refused("stop_token_ids", stop_token_ids=[p.served.state.tokenizer.get_vocab_size()])

    # Constrained output a stop token cuts short is the client's 400, as with stop strings.
    choice = "alpha beta"
    if p.real:  # every token the choice can start with: the output stops at once
        tokenizer = p.served.state.tokenizer
        pieces = {i: tokenizer.decode([i]) for i in range(tokenizer.get_vocab_size())}
        ids = [i for i, piece in pieces.items() if piece and piece in choice]
    else:  # the toy's tokens are its words
        ids = [toy_model.token_id("beta")]
    constrained = {"structured_outputs": {"choice": [choice]}, "max_tokens": 8}
    _stopped(p.post(stop_token_ids=ids, **constrained), "stop_token_ids")


@case(GEN, "include_stop_str_in_output")
def _(p: Probe) -> None:
    words = _text(p, p.ok(max_tokens=8, temperature=0)).split()
    at = next(i for i in range(1, 8) if words[i] not in " ".join(words[:i]))
    reply = p.ok(max_tokens=8, temperature=0, stop=[words[at]], include_stop_str_in_output=True)
    assert p.last().sampling_parameters["include_stop_str_in_output"] is True
    assert _text(p, reply).split() == words[: at + 1]
    assert reply["choices"][0]["finish_reason"] == "stop"


@case(GEN, "allowed_token_ids")
def _(p: Probe) -> None:
    token = _plain_token(p)
    reply = p.ok(allowed_token_ids=[token], temperature=0)
    assert p.last().sampling_parameters["allowed_token_ids"] == [token]
    assert p.tokens(_text(p, reply)) == [token] * 3
    p.refused("allowed_token_ids", allowed_token_ids=[])
    p.refused("allowed_token_ids", allowed_token_ids=[-1])
    _refused_beside_grammar(p, "allowed_token_ids", allowed_token_ids=[token])


@case(GEN, "bad_words")
def _(p: Probe) -> None:
    token = _plain_token(p)
    word = p.served.state.tokenizer.decode([token])
    forced = {"temperature": 0, "logit_bias": {str(token): 100}}
    assert p.tokens(_text(p, p.ok(**forced))) == [token] * 3
    reply = p.ok(bad_words=[word], **forced)
    assert p.last().sampling_parameters["bad_words"] == [word]
    assert token not in p.tokens(_text(p, reply))
    p.refused("bad_words", bad_words=[""])
    _refused_beside_grammar(p, "bad_words", bad_words=[word])


for _field in ("audio", "function_call", "functions", "prediction", "reasoning_effort"):

    @case(CHAT, _field)
    def _(p: Probe, field: str = _field) -> None:
        value = {"format": "wav", "voice": "x"} if field == "audio" else "low"
        p.refused(field, **{field: value})


@case(CHAT, "web_search_options")
def _(p: Probe) -> None:
    p.refused("web_search_options", web_search_options={})


@case(CHAT, "add_generation_prompt")
def _(p: Probe) -> None:
    p.ok()
    assert p.last().text_input.endswith("hi<|im_end|>\n<|im_start|>assistant\n")
    p.ok(add_generation_prompt=False)
    assert p.last().text_input.endswith("hi<|im_end|>\n")


@case(CHAT, "continue_final_message")
def _(p: Probe) -> None:
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "It is "}]
    reply = p.ok(messages=turns, continue_final_message=True)
    assert p.last().text_input.endswith("hi<|im_end|>\n<|im_start|>assistant\nIt is ")
    assert reply["usage"]["completion_tokens"] == 3
    both = {"continue_final_message": True, "add_generation_prompt": True}
    p.refused("continue_final_message", messages=turns, **both)
    empty = [turns[0], {"role": "assistant", "content": " "}]
    p.refused("continue_final_message", messages=empty, continue_final_message=True)


@case(CHAT, "chat_template_kwargs")
def _(p: Probe) -> None:
    p.ok(chat_template_kwargs={"enable_thinking": False})
    assert p.last().text_input.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    p.ok(chat_template_kwargs={"enable_thinking": True})
    assert p.last().text_input.endswith("<|im_start|>assistant\n")
    for name in ("thinking", "add_generation_prompt", "raise_exception"):
        p.refused("chat_template_kwargs", chat_template_kwargs={name: False})


@case(CHAT, "logprobs")
def _(p: Probe) -> None:
    reply = p.ok(logprobs=True)
    assert p.last().sampling_parameters["logprobs"] == 0 and p.last().flags["return_logprobs"]
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(c["logprob"] <= 0 for c in content)
    text = reply["choices"][0]["message"]["content"]
    if not p.real:  # toy: a word a token
        assert " ".join(c["token"] for c in content) == text
        return
    # A token's bytes, not its name, put text back together: a name can be "bytes:\\xNN".
    assert _as_text(b"".join(bytes(c["bytes"]) for c in content).decode("utf-8", "replace"), text)
    # vLLM's text leaves out bytes that never complete a character; the tokenizer keeps them.
    token_id = _partial_utf8_token(p)
    reply = p.ok(logprobs=True, top_logprobs=2, logit_bias={str(token_id): 100}, temperature=0)
    content = reply["choices"][0]["logprobs"]["content"]
    raw = bytes(content[0]["bytes"])
    joined = b"".join(bytes(c["bytes"]) for c in content).decode("utf-8", "replace")
    assert joined == p.served.state.tokenizer.decode([token_id] * len(content))
    for item in content:
        assert _named_bytes(item["token"]) == bytes(item["bytes"]) == raw
        assert len({t["token"] for t in item["top_logprobs"]}) == 2


@case(CHAT, "top_logprobs")
def _(p: Probe) -> None:
    reply = p.ok(logprobs=True, top_logprobs=3)
    assert p.last().sampling_parameters["logprobs"] == 3
    for item in reply["choices"][0]["logprobs"]["content"]:
        tops = [t["logprob"] for t in item["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
    p.refused("top_logprobs", top_logprobs=2)


@case(CHAT, "max_completion_tokens")
def _(p: Probe) -> None:
    body = {k: v for k, v in BASE[CHAT].items() if k != "max_tokens"}
    response = httpx.post(p.served.url + CHAT, json={**body, "max_completion_tokens": 4})
    assert response.status_code == 200
    assert p.last().sampling_parameters["max_tokens"] == 4
    p.refused("max_completion_tokens", max_completion_tokens=5)  # differs from max_tokens=3


@case(CHAT, "metadata")
def _(p: Probe) -> None:
    p.inert(metadata={"team": "search"})


@case(CHAT, "modalities")
def _(p: Probe) -> None:
    p.inert(modalities=["text"])
    p.refused("modalities", modalities=["text", "audio"])


@case(CHAT, "parallel_tool_calls")
def _(p: Probe) -> None:
    p.inert(parallel_tool_calls=True)
    p.inert(parallel_tool_calls=False)  # no tools: nothing to limit
    # LangChain's with_structured_output(method="function_calling") sends exactly this.
    named = {"type": "function", "function": {"name": "lookup"}}
    one = {"tools": [LOOKUP_TOOL], "tool_choice": named, "max_tokens": 90, "temperature": 0}
    reply = p.ok(**one, parallel_tool_calls=False)
    assert len(reply["choices"][0]["message"]["tool_calls"]) == 1
    assert p.last().sampling_parameters == p.sent(**one)
    required = {"tools": [LOOKUP_TOOL], "tool_choice": "required", "max_tokens": 60}
    p.post(**required, parallel_tool_calls=False)  # a random model may be cut by max_tokens
    forced = json.loads(p.last().sampling_parameters["structured_outputs"])["json"]
    assert forced["maxItems"] == 1 and forced["minItems"] == 1
    p.refused("parallel_tool_calls", tools=[LOOKUP_TOOL], parallel_tool_calls=False)


@case(CHAT, "prompt_cache_key")
def _(p: Probe) -> None:
    p.inert(prompt_cache_key="k1")


@case(CHAT, "prompt_cache_retention")
def _(p: Probe) -> None:
    p.inert(prompt_cache_retention="in_memory")
    p.refused("prompt_cache_retention", prompt_cache_retention="24h")


@case(GEN, "response_format")
def _(p: Probe) -> None:
    response = p.post(response_format={"type": "json_object"}, max_tokens=10)
    assert json.loads(p.last().sampling_parameters["structured_outputs"]) == {"json_object": True}
    if response.status_code == 400:
        # json_object bounds no string: the real random model may still be inside one.
        assert p.real and response.json()["error"]["code"] == "output_truncated", response.text
    else:
        assert isinstance(json.loads(_text(p, response.json())), dict), response.text
    assert "structured_outputs" not in p.sent(response_format={"type": "text"})
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x", "y"]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    strict = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": schema}}
    assert json.loads(_text(p, p.ok(response_format=strict, max_tokens=16)))["a"] in ("x", "y")
    p.refused(
        "response_format.json_schema.schema",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": 5}},
        },
    )
    if p.route == COMPLETIONS:
        p.refused("response_format", response_format=JSON_OBJECT, max_tokens=0, echo=True)


@case(GEN, "skip_special_tokens")
def _(p: Probe) -> None:
    assert p.sent(skip_special_tokens=False)["skip_special_tokens"] is False
    if p.real:  # the tiny Llama's <|user|> is a special token; the toy has none
        user = {"3": 100}
        assert _text(p, p.ok(logit_bias=user, temperature=0)) == ""
        shown = p.ok(logit_bias=user, temperature=0, skip_special_tokens=False)
        assert _text(p, shown) == "<|user|>" * 3
    if p.route == CHAT:
        p.refused("skip_special_tokens", skip_special_tokens=True, tools=[LOOKUP_TOOL])


@case(GEN, "spaces_between_special_tokens")
def _(p: Probe) -> None:
    sent = p.sent(spaces_between_special_tokens=False, skip_special_tokens=False)
    assert sent["spaces_between_special_tokens"] is False


@case(GEN, "return_token_ids")
def _(p: Probe) -> None:
    no_eos = {"logit_bias": {"0": -100}} if p.real else {}
    reply = p.ok(return_token_ids=True, max_tokens=5, temperature=0, **no_eos)
    choice = reply["choices"][0]
    ids = choice["token_ids"]
    prompt_ids = reply["prompt_token_ids"] if p.route == CHAT else choice["prompt_token_ids"]
    assert ids and len(ids) == reply["usage"]["completion_tokens"]
    # The logprobs asked for to learn the ids stay out of the response.
    assert p.last().sampling_parameters["logprobs"] == 0 and choice["logprobs"] is None
    if p.real:
        assert _as_text(p.served.state.tokenizer.decode(ids), _text(p, reply))
        assert prompt_ids == p.served.state.prompt_ids(p.last().text_input)
        assert len(prompt_ids) == reply["usage"]["prompt_tokens"]
    else:  # the toy's tokens are its words
        assert ids == [toy_model.token_id(word) for word in _text(p, reply).split(" ")]

    # Streamed as vLLM streams them: each chunk's own tokens, the prompt's ids once, up front.
    usage = {"include_usage": True}
    events = _sse(
        p.post(
            return_token_ids=True,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options=usage,
            **no_eos,
        )
    )
    chunks = [e for e in events if e["choices"]]
    assert [i for e in chunks for i in e["choices"][0]["token_ids"]] == ids
    holders = chunks if p.route == CHAT else [e["choices"][0] for e in chunks]
    assert holders[0]["prompt_token_ids"] == prompt_ids
    assert not any("prompt_token_ids" in h for h in holders[1:])
    assert all(e["choices"][0]["logprobs"] is None for e in chunks)
    assert events[-1]["usage"]["completion_tokens"] == len(ids)


@case(GEN, "request_id")
def _(p: Probe) -> None:
    prefix = "chatcmpl" if p.route == CHAT else "cmpl"
    assert p.ok(request_id="trace:42.a_b-c")["id"] == f"{prefix}-trace:42.a_b-c"
    # Triton's request id too (one per prompt on text completions), for its logs and traces.
    assert p.last().request_id.startswith(f"{prefix}-trace:42.a_b-c")
    events = _sse(p.post(request_id="t1", stream=True))
    assert {e["id"] for e in events} == {f"{prefix}-t1"}
    assert p.ok()["id"] != p.ok()["id"]
    p.refused("request_id", request_id="has space")
    p.refused("request_id", request_id="x" * 129)


@case(GEN, "cache_salt")
def _(p: Probe) -> None:
    # Longer than one prefix-cache block (the real engine's are 128 tokens on a CPU).
    text = "the cat sat on the mat and the dog ran up " * 20
    prompt = (
        {"messages": [{"role": "user", "content": text}]} if p.route == CHAT else {"prompt": text}
    )

    def cached(**fields: Any) -> int:
        reply = p.ok(max_tokens=2, **prompt, **fields)
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    # Salts no request has used: only a request with the same salt finds the prompt cached.
    first, second = f"tenant-{uuid.uuid4().hex}", f"tenant-{uuid.uuid4().hex}"
    assert cached(cache_salt=first) == 0
    assert p.last().parameters == {"cache_salt": first}
    assert cached(cache_salt=first) > 0
    assert cached(cache_salt=second) == 0
    cached()
    assert cached() > 0 and p.last().parameters == {}
    streamed = _sse(
        p.post(max_tokens=2, stream=True, stream_options={"include_usage": True}, **prompt)
    )
    assert streamed[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    p.refused("cache_salt", cache_salt="")


@case(GEN, "prompt_logprobs")
def _(p: Probe) -> None:
    reply = p.ok(prompt_logprobs=2)
    assert p.last().sampling_parameters["prompt_logprobs"] == 2
    rows = reply["prompt_logprobs"] if p.route == CHAT else reply["choices"][0]["prompt_logprobs"]
    assert len(rows) == reply["usage"]["prompt_tokens"] and rows[0] is None
    for row in rows[1:]:
        # The prompt's own token first, then the two likeliest (which may include it).
        assert 2 <= len(row) <= 3 and all(e["logprob"] <= 0 for e in row.values())
        ranked = sorted(row.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked[:2]] == [1, 2]
        assert ranked[0]["logprob"] >= ranked[1]["logprob"]
    if p.route == COMPLETIONS:
        # The same numbers as echo's logprobs of the prompt's tokens.
        echoed = p.ok(echo=True, logprobs=1, max_tokens=1)["choices"][0]["logprobs"]
        own = [next(iter(row.values()))["logprob"] for row in rows[1:]]
        assert echoed["token_logprobs"][1 : len(rows)] == pytest.approx(own, abs=1e-4)
    p.refused("prompt_logprobs", prompt_logprobs=1, stream=True)
    p.refused("prompt_logprobs", prompt_logprobs=p.served.state.settings.max_logprobs + 1)


@case(GEN, "return_tokens_as_token_ids")
def _(p: Probe) -> None:
    if p.route == CHAT:
        reply = p.ok(logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
        content = reply["choices"][0]["logprobs"]["content"]
        names = [c["token"] for c in content]
        tops = [[t["token"] for t in c["top_logprobs"]] for c in content]
    else:
        reply = p.ok(logprobs=2, return_tokens_as_token_ids=True)
        names = reply["choices"][0]["logprobs"]["tokens"]
        tops = [list(t) for t in reply["choices"][0]["logprobs"]["top_logprobs"]]
    assert all(len(row) == 2 and all(t.startswith("token_id:") for t in row) for row in tops)
    ids = [int(name.removeprefix("token_id:")) for name in names]
    text = _text(p, reply)
    if p.real:
        assert _as_text(p.served.state.tokenizer.decode(ids), text)
    else:  # the toy's tokens are its words
        assert ids == [toy_model.token_id(word) for word in text.split(" ")]
    asked = {"logprobs": True} if p.route == CHAT else {"logprobs": 1}
    events = _sse(p.post(stream=True, return_tokens_as_token_ids=True, **asked))
    key = "content" if p.route == CHAT else "tokens"
    streamed = [
        t["token"] if p.route == CHAT else t
        for e in events
        for c in e["choices"]
        for t in (c["logprobs"] or {}).get(key) or ()
    ]
    assert streamed and all(t.startswith("token_id:") for t in streamed), streamed
    p.refused("return_tokens_as_token_ids", return_tokens_as_token_ids=True)


@case(GEN, "priority")
def _(p: Probe) -> None:
    p.inert(priority=0)
    p.refused("priority", priority=1)


@case(GEN, "structured_outputs")
def _(p: Probe) -> None:
    # A random model writes none of these unless the engine enforces them.
    choices = ["yes", "no", "maybe"]
    assert _text(p, p.ok(structured_outputs={"choice": choices}, max_tokens=8)) in choices
    assert json.loads(p.last().sampling_parameters["structured_outputs"]) == {"choice": choices}
    assert _text(p, p.ok(structured_outputs={"regex": "abc 123"}, max_tokens=12)) == "abc 123"
    grammar = 'root ::= "abc"'
    assert _text(p, p.ok(structured_outputs={"grammar": grammar}, max_tokens=12)) == "abc"
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x", "y"]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    for spec in (schema, json.dumps(schema)):  # vLLM takes the schema as JSON text too
        document = json.loads(_text(p, p.ok(structured_outputs={"json": spec}, max_tokens=16)))
        assert document["a"] in ("x", "y")
        assert json.loads(p.last().sampling_parameters["structured_outputs"]) == {"json": schema}

    long = {"choice": ["yes yes yes yes yes yes"]}
    response = p.post(structured_outputs=long, max_tokens=2)
    assert response.status_code == 400 and response.json()["error"]["code"] == "output_truncated"
    events = p.post(structured_outputs=long, max_tokens=2, stream=True).text.split("\n\n")
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "output_truncated"

    # vLLM learns that some grammars do not compile only inside the engine.
    response = p.post(structured_outputs={"grammar": "root ::= foo"})
    error = response.json()["error"]
    if p.real:  # our backend has vLLM's front check it first
        assert response.status_code == 400 and error["code"] == "engine_refused"
    else:  # the engine core's compile fails: vLLM's finish_reason "error"
        assert response.status_code == 502 and error["code"] == "engine_error"
        assert response.headers["x-should-retry"] == "false"

    p.refused("structured_outputs", structured_outputs={"choice": ["a"], "regex": "a"})
    p.refused("structured_outputs", structured_outputs={})
    p.refused("structured_outputs.choice", structured_outputs={"choice": ["a", ""]})
    p.refused("structured_outputs.json", structured_outputs={"json": "[1"})
    p.refused("structured_outputs.json", structured_outputs={"json": {"type": 5}})
    p.refused("structured_outputs.json_object", structured_outputs={"json_object": False})
    p.refused(
        "structured_outputs.whitespace_pattern",
        structured_outputs={"json_object": True, "whitespace_pattern": " "},
    )
    if p.route == CHAT:
        p.refused(
            "structured_outputs", structured_outputs={"choice": ["a"]}, response_format=JSON_OBJECT
        )


@case(CHAT, "safety_identifier")
def _(p: Probe) -> None:
    p.inert(safety_identifier="hash-of-user")


@case(CHAT, "service_tier")
def _(p: Probe) -> None:
    p.inert(service_tier="auto")
    p.inert(service_tier="default")
    p.refused("service_tier", service_tier="priority")


@case(CHAT, "store")
def _(p: Probe) -> None:
    p.inert(store=False)
    p.refused("store", store=True)


@case(CHAT, "verbosity")
def _(p: Probe) -> None:
    p.inert(verbosity="medium")
    p.refused("verbosity", verbosity="high")


@case(CHAT, "tools")
def _(p: Probe) -> None:
    reply = p.ok(tools=[LOOKUP_TOOL], max_tokens=4, temperature=0)
    assert "Tools: " in p.last().text_input and '"lookup"' in p.last().text_input
    assert reply["choices"][0]["message"].get("tool_calls") is None
    # Streamed: the same template, the output parsed as it arrives (no call in plain text).
    events = _sse(p.post(tools=[LOOKUP_TOOL], max_tokens=4, stream=True, temperature=0))
    assert "Tools: " in p.last().text_input and p.last().flags["stream"] is True
    assert all("tool_calls" not in e["choices"][0]["delta"] for e in events if e["choices"])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == reply["choices"][0]["message"]["content"]


@case(CHAT, "tool_choice")
def _(p: Probe) -> None:
    named = {"type": "function", "function": {"name": "lookup"}}
    reply = p.ok(tools=[LOOKUP_TOOL], tool_choice=named, max_tokens=90, temperature=0)
    sent = json.loads(p.last().sampling_parameters["structured_outputs"])
    assert sent == {"json": LOOKUP_TOOL["function"]["parameters"]}
    call = reply["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"])
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    required = p.post(tools=[LOOKUP_TOOL], tool_choice="required", max_tokens=60)
    if required.status_code == 400:
        # "required" is an array of calls with no bound on its length (as in vLLM's own server):
        # a random model may still be adding calls at max_tokens.
        assert p.real and required.json()["error"]["code"] == "output_truncated", required.text
    else:
        calls = required.json()["choices"][0]["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == "lookup", required.text
    p.ok(tools=[LOOKUP_TOOL], tool_choice="none")
    assert "Tools: " not in p.last().text_input
    streamed = _sse(
        p.post(tools=[LOOKUP_TOOL], tool_choice=named, max_tokens=90, temperature=0, stream=True)
    )
    assert json.loads(p.last().sampling_parameters["structured_outputs"]) == sent
    first = streamed[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["function"]["name"] == "lookup" and first["type"] == "function"
    assert streamed[-1]["choices"][0]["finish_reason"] == "tool_calls"
    response = p.post(tool_choice="auto")
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"


@case(COMPLETIONS, "prompt")
def _(p: Probe) -> None:
    reply = p.ok(prompt=["the cat", "a dog"], n=2)
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert [r.text_input for r in p.served.requests[-2:]] == ["the cat", "a dog"]
    # Token ids go as the text they tokenize back from.
    ids = p.served.state.prompt_ids("the cat")
    as_text = p.ok(temperature=0)
    as_ids = p.ok(prompt=ids, temperature=0)
    assert p.last().text_input == "the cat"
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert as_ids["usage"]["prompt_tokens"] == len(ids)
    p.ok(prompt=[ids, p.served.state.prompt_ids("a dog")])
    assert [r.text_input for r in p.served.requests[-2:]] == ["the cat", "a dog"]
    p.refused("prompt", prompt=[p.served.state.tokenizer.get_vocab_size()])
    p.refused("prompt", prompt=[[]])
    if p.real:  # a byte of a UTF-8 sequence alone: no text tokenizes to it
        p.refused("prompt", prompt=[_partial_utf8_token(p)])
    p.refused("prompt", prompt=["a", "b", "c"], n=128)  # 384 choices > max_choices (256)


@case(COMPLETIONS, "best_of")
def _(p: Probe) -> None:
    p.ok(best_of=2, n=2)
    p.refused("best_of", best_of=3, n=1)


@case(COMPLETIONS, "echo")
def _(p: Probe) -> None:
    plain = p.ok(temperature=0)["choices"][0]["text"]
    reply = p.ok(echo=True, temperature=0)
    assert reply["choices"][0]["text"] == "the cat" + plain
    # With logprobs the prompt's tokens come first; the first has no log-probability.
    prompt = p.served.state.tokenizer.encode("the cat", add_special_tokens=True).ids
    for stream in (False, True):
        response = p.post(echo=True, logprobs=1, temperature=0, stream=stream)
        assert p.last().sampling_parameters["prompt_logprobs"] == 1
        choice = (_sse(response) if stream else [response.json()])[0]["choices"][0]
        lp = choice["logprobs"]
        assert choice["text"].startswith("the cat") and len(lp["tokens"]) > len(prompt)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(x <= 0 for x in lp["token_logprobs"][1:])
        assert all(len(top) == 1 for top in lp["top_logprobs"][1:])
    # max_tokens 0 (with echo only): the prompt and its log-probabilities, nothing generated.
    only = p.ok(echo=True, logprobs=1, max_tokens=0)["choices"][0]
    assert only["text"] == "the cat" and len(only["logprobs"]["tokens"]) == len(prompt)
    assert only["logprobs"]["token_logprobs"][1:] == lp["token_logprobs"][1 : len(prompt)]
    p.refused("max_tokens", max_tokens=0)


@case(COMPLETIONS, "logprobs")
def _(p: Probe) -> None:
    reply = p.ok(logprobs=2)
    assert p.last().sampling_parameters["logprobs"] == 2
    lp = reply["choices"][0]["logprobs"]
    # Tokens that are part of a UTF-8 sequence are named by their bytes, so keys stay distinct.
    assert len(lp["tokens"]) == 3 and all(len(t) == 2 for t in lp["top_logprobs"])
    if p.real:
        token_id = _partial_utf8_token(p)
        reply = p.ok(logprobs=1, logit_bias={str(token_id): 100}, temperature=0)
        named = [_named_bytes(t) for t in reply["choices"][0]["logprobs"]["tokens"]]
        joined = b"".join(named).decode("utf-8", "replace")
        assert joined == p.served.state.tokenizer.decode([token_id] * len(named))


@case(COMPLETIONS, "suffix")
def _(p: Probe) -> None:
    p.refused("suffix", suffix="end")


@case(EMBEDDINGS, "input")
def _(p: Probe) -> None:
    reply = p.ok(input=["the cat", "a dog"])
    assert [d["index"] for d in reply["data"]] == [0, 1]
    assert reply["data"][0]["embedding"] != reply["data"][1]["embedding"]
    as_ids = p.ok(input=[p.served.state.prompt_ids("the cat")])
    assert p.last().embedding_request["input"] == "the cat"
    assert as_ids["data"][0]["embedding"] == reply["data"][0]["embedding"]
    p.refused("input", input=[[p.served.state.tokenizer.get_vocab_size()]])


@case(EMBEDDINGS, "dimensions")
def _(p: Probe) -> None:
    if p.real:
        # vLLM truncates only Matryoshka models' embeddings; the tiny Llama's config says none.
        p.refused("dimensions", dimensions=3)
        return
    reply = p.ok(dimensions=3)
    assert len(reply["data"][0]["embedding"]) == 3
    assert p.last().embedding_request["pooling_params"] == {"dimensions": [3]}
    p.refused("dimensions", dimensions=9)


@case(EMBEDDINGS, "encoding_format")
def _(p: Probe) -> None:
    import base64

    import numpy as np

    floats = p.ok(encoding_format="float")["data"][0]["embedding"]
    packed = p.ok(encoding_format="base64")["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert decoded.tolist() == pytest.approx(floats, rel=1e-6)


@case(SCORE, "prompt")
def _(p: Probe) -> None:
    reply = p.ok(prompt="the dog", candidates=[" sat"])
    # The prompt's own request and the candidate's run at once: either may be recorded last.
    assert "the dog sat" in {r.text_input for r in p.served.requests[-2:]}
    assert reply["data"][0]["num_tokens"] == len(p.tokens("the dog sat")) - len(p.tokens("the dog"))


@case(SCORE, "candidates")
def _(p: Probe) -> None:
    reply = p.ok()
    sent = [r for r in p.served.requests[-3:] if r.sampling_parameters.get("prompt_logprobs") == 0]
    assert {r.text_input for r in sent} == {"the cat sat", "the cat ran far"}
    assert all(r.sampling_parameters["max_tokens"] == 1 for r in sent)
    scores = {d["candidate"]: d for d in reply["data"]}
    far = len(p.tokens("the cat ran far")) - len(p.tokens("the cat"))
    assert scores[" ran far"]["num_tokens"] == far
    assert scores[" ran far"]["logprob"] == pytest.approx(sum(scores[" ran far"]["token_logprobs"]))
    assert all(d["logprob"] < 0 for d in reply["data"])
    response = p.post(candidates=[" sat", "er"])  # "cater" would re-tokenize the prompt
    assert response.status_code == 400 and response.json()["error"]["param"] == "candidates[1]"


def _count(p: Probe, **fields: Any) -> int:
    """``/tokenize``'s count for a conversation (``messages`` HI unless given)."""
    return p.ok(prompt=None, **{"messages": HI, **fields})["count"]


@case(TOKENIZE, "prompt")
def _(p: Probe) -> None:
    reply = p.ok()
    ids = p.served.state.prompt_ids("the cat")
    assert (reply["tokens"], reply["count"]) == (ids, len(ids))
    assert reply["max_model_len"] == p.served.state.settings.max_model_len
    completion = httpx.post(p.served.url + COMPLETIONS, json=BASE[COMPLETIONS], timeout=30)
    assert completion.json()["usage"]["prompt_tokens"] == reply["count"]
    p.refused("prompt", prompt=None)
    p.refused("prompt", messages=HI)


@case(TOKENIZE, "messages")
def _(p: Probe) -> None:
    chat = httpx.post(p.served.url + CHAT, json=BASE[CHAT], timeout=30).json()
    reply = p.ok(prompt=None, messages=HI)
    assert reply["count"] == chat["usage"]["prompt_tokens"]
    assert reply["tokens"] == p.served.state.prompt_ids(p.served.requests[-1].text_input)


@case(TOKENIZE, "add_special_tokens")
def _(p: Probe) -> None:
    plain = p.served.state.tokenizer.encode("the cat", add_special_tokens=False).ids
    assert p.ok(add_special_tokens=False)["tokens"] == plain
    p.refused("add_special_tokens", prompt=None, messages=HI, add_special_tokens=True)


@case(TOKENIZE, "add_generation_prompt")
def _(p: Probe) -> None:
    assert _count(p, add_generation_prompt=False) < _count(p)
    p.refused("add_generation_prompt", add_generation_prompt=False)


@case(TOKENIZE, "continue_final_message")
def _(p: Probe) -> None:
    turns = [*HI, {"role": "assistant", "content": "It is"}]
    reply = p.ok(prompt=None, messages=turns, continue_final_message=True)
    open_turn = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nIt is"
    assert reply["tokens"] == p.served.state.prompt_ids(open_turn)
    p.refused("continue_final_message", continue_final_message=True)


@case(TOKENIZE, "chat_template_kwargs")
def _(p: Probe) -> None:
    assert _count(p, chat_template_kwargs={"enable_thinking": False}) > _count(p)
    p.refused("chat_template_kwargs", prompt=None, messages=HI, chat_template_kwargs={"x": 1})


@case(TOKENIZE, "tools")
def _(p: Probe) -> None:
    assert _count(p, tools=[LOOKUP_TOOL]) > _count(p)
    p.refused("tools", tools=[LOOKUP_TOOL])


@case(TOKENIZE, "return_token_strs")
def _(p: Probe) -> None:
    reply = p.ok(return_token_strs=True)
    tokenizer = p.served.state.tokenizer
    assert reply["token_strs"] == [tokenizer.id_to_token(i) for i in reply["tokens"]]
    assert p.ok()["token_strs"] is None


@case(DETOKENIZE, "tokens")
def _(p: Probe) -> None:
    assert p.ok(tokens=p.served.state.prompt_ids("the cat"))["prompt"] == "the cat"
    p.refused("tokens", tokens=[p.served.state.tokenizer.get_vocab_size()])


ROWS = [(route, rule.field, rule.policy) for route, rules in TABLES.items() for rule in rules]


@pytest.mark.parametrize("backend", ["real", "standin"])
@pytest.mark.parametrize(("route", "field", "policy"), ROWS, ids=[f"{r}:{f}" for r, f, _ in ROWS])
def test_field_row(
    request: pytest.FixtureRequest, backend: str, route: str, field: str, policy: Policy
) -> None:
    assert (route, field) in CASES, f"the field table row {route} {field} has no test case"
    if backend == "standin":
        served = request.getfixturevalue("frontend")
    else:
        served = request.getfixturevalue(
            "real_embed_frontend" if route == EMBEDDINGS else "real_frontend"
        )
    CASES[(route, field)](Probe(served, route))


def test_every_request_field_has_exactly_one_row() -> None:
    models = {
        CHAT: ChatCompletionRequest,
        COMPLETIONS: CompletionRequest,
        EMBEDDINGS: EmbeddingRequest,
        SCORE: ScoreRequest,
        TOKENIZE: TokenizeRequest,
        DETOKENIZE: DetokenizeRequest,
    }
    for route, model in models.items():
        rows = [rule.field for rule in TABLES[route]]
        assert sorted(rows) == sorted(model.model_fields), route


def test_fields_doc_is_generated_from_the_table() -> None:
    doc = Path(__file__).parents[2] / "docs" / "frontend-fields.md"
    assert doc.read_text() == render_markdown()
