"""A deterministic toy language model for the KServe v2 stand-in (a test double, not an engine).

It stands in for vLLM behind Triton's vLLM backend: whitespace "tokens", a fixed vocabulary of
words, logits derived from a hash of the context, so the same request always gives the same
text, log-probabilities, prompt log-probabilities and embeddings. It honours the sampling
parameters a test can observe (``max_tokens``, ``min_tokens``, ``stop``, ``n``, ``seed``,
``temperature``, ``logprobs``, ``prompt_logprobs``, ``logit_bias``, ``allowed_token_ids``,
``ignore_eos``, ``top_k``, ``repetition_penalty``, ``stop_token_ids``,
``include_stop_str_in_output``, ``bad_words``) and structured outputs (a document that
satisfies the JSON schema, the first choice, a regex or grammar that is one literal string; a
grammar of any other form ends the request with vLLM's finish_reason ``error``, as a grammar the
engine cannot compile does). Scripted replies (``scripts``: a regular expression searched in the
prompt, and the reply) stand in for what a real model writes in a given situation, such as tool
calls, a few characters a token.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VOCAB", "ToyChoice", "ToyModel", "ToyPrefixCache", "ToyStep", "token_id"]

VOCAB: tuple[str, ...] = (
    "<eos>",
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "and",
    "ran",
    "far",
    "away",
    "blue",
    "red",
    "green",
    "sky",
    "sea",
    "is",
    "was",
    "very",
    "calm",
    "today",
    "yes",
    "no",
    "hello",
    "world",
    "model",
    "token",
    "fast",
    "slow",
    "up",
    "down",
)
EOS_ID = 0
# Unicode White_Space, what tokenizers' WhitespaceSplit splits on (str.split also splits on
# \x1c-\x1f, which would make test tokenizers count differently from the toy model).
_WHITESPACE = re.compile(
    "[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+"
)


def token_id(word: str) -> int:
    """Id of a whitespace token: its vocabulary index, or a stable hash into the vocabulary."""
    if word in VOCAB:
        return VOCAB.index(word)
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest()
    return 1 + int.from_bytes(digest, "little") % (len(VOCAB) - 1)


def _logits(context: tuple[int, ...], salt: int) -> list[float]:
    digest = hashlib.blake2b(repr((context, salt)).encode(), digest_size=len(VOCAB)).digest()
    # EOS is made unlikely so generations run to max_tokens unless a test biases it.
    return [(-8.0 if i == EOS_ID else (b / 32.0)) for i, b in enumerate(digest)]


def _shaped(logits: list[float], context: tuple[int, ...], params: dict[str, Any]) -> list[float]:
    """``logits`` after repetition_penalty, then top_k judged by the unsalted logits (the salt
    stands in for sampling noise, which top_k narrows)."""
    penalty = float(params.get("repetition_penalty") or 1.0)
    for tok in set(context):
        logits[tok] = logits[tok] / penalty if logits[tok] > 0 else logits[tok] * penalty
    top_k = int(params.get("top_k") or 0)
    if top_k <= 0:
        return logits
    model = _logits(context, 0)
    keep = set(sorted(range(len(VOCAB)), key=lambda i: -model[i])[:top_k])
    return [x if i in keep else -1e9 for i, x in enumerate(logits)]


def _log_softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    total = math.log(sum(math.exp(x - top) for x in logits)) + top
    return [x - total for x in logits]


@dataclass(frozen=True)
class ToyStep:
    """One generated token with its log-probability and the top alternatives."""

    token_id: int
    text: str
    logprob: float
    top: dict[int, float]


@dataclass
class ToyChoice:
    """The state of one of the ``n`` outputs of a request."""

    steps: list[ToyStep] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    #: As vLLM's: the stop string or stop token id that ended the choice (None for EOS).
    stop_reason: str | int | None = None

    @property
    def cumulative_logprob(self) -> float:
        return sum(s.logprob for s in self.steps)


def _append(choice: ToyChoice, piece: str, stops: list[str], keep_stop: bool) -> None:
    """Add a token's text; like vLLM, a stop string that it completes ends the choice there."""
    before = len(choice.text)
    choice.text += piece
    for s in stops:
        # Only text that the new token completed is searched.
        at = choice.text.find(s, max(0, before - len(s) + 1)) if s else -1
        if at >= 0:
            choice.text = choice.text[: at + len(s) if keep_stop else at]
            choice.finish_reason = "stop"
            choice.stop_reason = s
            return


class ToyPrefixCache:
    """vLLM's prefix cache as a client sees it (``RequestOutput.num_cached_tokens``): a prompt's
    leading whole blocks that an earlier prompt with the same ``cache_salt`` computed. As in
    vLLM, the prompt's last token is always computed, so a repeated prompt is not all cached."""

    BLOCK = 4

    def __init__(self) -> None:
        self._blocks: set[tuple[str | None, tuple[int, ...]]] = set()

    def lookup(self, tokens: list[int], salt: str | None) -> int:
        """The tokens of ``tokens`` served from the cache; its blocks are cached from now on."""
        cached = 0
        for end in range(self.BLOCK, len(tokens), self.BLOCK):
            if (salt, tuple(tokens[:end])) not in self._blocks:
                break
            cached = end
        for end in range(self.BLOCK, len(tokens) + 1, self.BLOCK):
            self._blocks.add((salt, tuple(tokens[:end])))
        return cached


class ToyModel:
    """Deterministic generation over :data:`VOCAB`; ``invalid_json`` corrupts JSON outputs.

    ``scripts`` are ``(pattern, reply)`` pairs: the first pattern found in a prompt (a regular
    expression, ``.`` matching newlines) makes the reply the output, three characters a token.
    """

    SCRIPT_TOKEN_CHARS = 3

    def __init__(
        self,
        *,
        invalid_json: bool = False,
        embedding_dim: int = 8,
        scripts: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.invalid_json = invalid_json
        self.embedding_dim = embedding_dim
        self.scripts = tuple((re.compile(p, re.DOTALL), reply) for p, reply in scripts)

    @staticmethod
    def tokenize(text: str) -> list[int]:
        return [token_id(w) for w in _WHITESPACE.split(text) if w]

    def prompt_logprobs(self, prompt: str, top: int = 0) -> list[dict[int, float] | None]:
        """Per prompt token, the log-probability of that token given the ones before it, then
        those of the ``top`` likeliest tokens there."""
        ids = self.tokenize(prompt)
        out: list[dict[int, float] | None] = [None] if ids else []
        for i in range(1, len(ids)):
            lp = _log_softmax(_logits(tuple(ids[:i]), 0))
            ranked = sorted(range(len(VOCAB)), key=lambda t: (-lp[t], t))[:top]
            out.append({ids[i]: lp[ids[i]], **{t: lp[t] for t in ranked}})
        return out

    def embed(self, text: str, dimensions: int | None = None) -> list[float]:
        dim = dimensions or self.embedding_dim
        raw = hashlib.blake2b(text.encode("utf-8"), digest_size=64).digest()
        vec = [(raw[i % len(raw)] - 127.5) / 127.5 + i * 1e-3 for i in range(dim)]
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]

    def generate(self, prompt: str, params: dict[str, Any]) -> Iterator[list[ToyChoice]]:
        """Yield the ``n`` choices after each decoding step until every choice has finished."""
        n = int(params.get("n", 1))
        choices = [ToyChoice() for _ in range(n)]
        fixed = self._structured_text(params)
        if fixed is _UNCOMPILABLE:
            for choice in choices:
                choice.finish_reason = "error"
            yield choices
            return
        if fixed is not None:
            yield from self._emit_fixed(choices, fixed, params)
            return
        script = next((reply for p, reply in self.scripts if p.search(prompt)), None)
        if script is not None:
            yield from self._emit_script(choices, script, params)
            return
        max_tokens = params.get("max_tokens", 16)
        min_tokens = int(params.get("min_tokens", 0))
        temperature = float(params.get("temperature", 1.0))
        seed = params.get("seed")
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        top_k = int(params.get("logprobs") or 0)
        bias = {int(k): float(v) for k, v in (params.get("logit_bias") or {}).items()}
        allowed = params.get("allowed_token_ids")
        banned = {token_id(w.strip()) for w in params.get("bad_words") or () if w.strip() in VOCAB}
        stop_ids = set(params.get("stop_token_ids") or ())
        keep_stop = bool(params.get("include_stop_str_in_output"))
        base = tuple(self.tokenize(prompt))
        limit = 16 if max_tokens is None else int(max_tokens)
        for step in range(limit):
            for index, choice in enumerate(choices):
                if choice.finish_reason is not None:
                    continue
                context = base + tuple(s.token_id for s in choice.steps)
                salt = 0 if temperature == 0 else hash((seed, index)) if seed is not None else index
                logits = _shaped(_logits(context, salt), context, params)
                for tok in banned:
                    logits[tok] = -1e9
                for tok, b in bias.items():
                    if 0 <= tok < len(VOCAB):
                        logits[tok] += b
                if allowed:
                    logits = [x if i in allowed else -1e9 for i, x in enumerate(logits)]
                if step < min_tokens or params.get("ignore_eos"):
                    logits[EOS_ID] = -1e9
                lp = _log_softmax(logits)
                tok = max(range(len(VOCAB)), key=lambda i: (lp[i], -i))
                ranked = sorted(range(len(VOCAB)), key=lambda i: (-lp[i], i))[:top_k]
                if tok == EOS_ID or tok in stop_ids:
                    choice.steps.append(ToyStep(tok, "", lp[tok], {i: lp[i] for i in ranked}))
                    choice.finish_reason = "stop"
                    choice.stop_reason = None if tok == EOS_ID else tok
                    continue
                piece = VOCAB[tok] if not choice.text else " " + VOCAB[tok]
                choice.steps.append(ToyStep(tok, piece, lp[tok], {i: lp[i] for i in ranked}))
                _append(choice, piece, stops, keep_stop)
                if choice.finish_reason is None and step == limit - 1:
                    choice.finish_reason = "length"
            yield choices
            if all(c.finish_reason is not None for c in choices):
                return

    def _emit_fixed(
        self, choices: list[ToyChoice], text: str, params: dict[str, Any]
    ) -> Iterator[list[ToyChoice]]:
        words = text.split(" ")
        # Like vLLM, a structured output cut by max_tokens (or by a stop string or token) is
        # returned truncated.
        limit = params.get("max_tokens") or 16
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        keep_stop = bool(params.get("include_stop_str_in_output"))
        stop_ids = set(params.get("stop_token_ids") or ())
        for step, word in enumerate(words[:limit]):
            for choice in choices:
                if choice.finish_reason is not None:
                    continue
                tid = token_id(word)
                if tid in stop_ids:
                    choice.steps.append(ToyStep(tid, "", -0.5, {tid: -0.5}))
                    choice.finish_reason = "stop"
                    choice.stop_reason = tid
                    continue
                piece = word if step == 0 else " " + word
                choice.steps.append(ToyStep(tid, piece, -0.5, {tid: -0.5}))
                _append(choice, piece, stops, keep_stop)
            yield choices
            if all(c.finish_reason is not None for c in choices):
                return
        for choice in choices:
            if choice.finish_reason is None:
                choice.finish_reason = "stop" if len(words) <= limit else "length"
        yield choices

    def _emit_script(
        self, choices: list[ToyChoice], reply: str, params: dict[str, Any]
    ) -> Iterator[list[ToyChoice]]:
        size = self.SCRIPT_TOKEN_CHARS
        pieces = [reply[i : i + size] for i in range(0, len(reply), size)]
        limit = params.get("max_tokens") or 16
        for piece in pieces[:limit]:
            for choice in choices:
                tid = token_id(piece.strip())
                choice.steps.append(ToyStep(tid, piece, -0.5, {tid: -0.5}))
                choice.text += piece
            yield choices
        for choice in choices:
            choice.finish_reason = "stop" if len(pieces) <= limit else "length"
        yield choices

    def _structured_text(self, params: dict[str, Any]) -> str | None:
        raw = params.get("structured_outputs", params.get("guided_decoding"))
        if raw is None:
            return None
        spec = json.loads(raw) if isinstance(raw, str) else raw
        if "json" in spec:
            schema = spec["json"]
            schema = json.loads(schema) if isinstance(schema, str) else schema
            text = json.dumps(_instance(schema))
        elif spec.get("json_object"):
            text = json.dumps({"answer": "yes"})
        elif "choice" in spec:
            text = spec["choice"][0]
        elif "regex" in spec and _LITERAL.fullmatch(spec["regex"]):
            text = spec["regex"]
        elif "grammar" in spec:
            literal = _LITERAL_GRAMMAR.fullmatch(spec["grammar"])
            if literal is None:
                return _UNCOMPILABLE
            text = literal[1]
        else:
            raise ValueError(
                "toy model supports json, json_object, choice, and literal regex and grammar, "
                f"got {spec}"
            )
        if self.invalid_json and text.startswith("{"):
            text = text[:-1]
        return text


_LITERAL = re.compile(r"[A-Za-z0-9 ]+")
_LITERAL_GRAMMAR = re.compile(r'root ::= "([A-Za-z0-9 ]+)"')
#: What ``_structured_text`` returns for a grammar the toy cannot "compile".
_UNCOMPILABLE = "\x00uncompilable"


def _instance(schema: dict[str, Any]) -> Any:
    """A small document that satisfies the common subset of JSON Schema used in tests."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _instance(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", list(props))
        return {name: _instance(props.get(name, {})) for name in required}
    if kind == "array":
        count = schema.get("minItems", 1)
        return [_instance(schema.get("items", {"type": "string"})) for _ in range(count)]
    if kind == "string":
        return "x" * schema.get("minLength", 3)
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    return None
