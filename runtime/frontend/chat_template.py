"""Chat templates read from the model's own ``tokenizer_config.json``, rendered with jinja2."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

__all__ = ["ChatTemplate", "ChatTemplateError", "cut_after_final_message", "tokenizer_adds_bos"]


class ChatTemplateError(ValueError):
    """The tokenizer files have no usable chat template, or rendering failed."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def tokenizer_adds_bos(tokenizer: Tokenizer, bos_token: str) -> bool:
    """Whether ``tokenizer`` starts what it encodes with ``bos_token`` on its own (its
    post-processor), as when vLLM tokenizes a text prompt with special tokens added."""
    bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
    return bos_id is not None and tokenizer.encode("", add_special_tokens=True).ids[:1] == [bos_id]


#: What :meth:`ChatTemplate.render` itself passes; a client's template kwargs may not set them.
_RENDER_NAMES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def _compile(source: str) -> tuple[jinja2.Template, frozenset[str], frozenset[str]]:
    """The compiled template, the names it reads, and the names it may not be given."""
    # The environment transformers' apply_chat_template gives templates.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(
        v, indent=indent, ensure_ascii=False
    )
    try:
        read = jinja2.meta.find_undeclared_variables(env.parse(source))
        return env.from_string(source), frozenset(read), _RENDER_NAMES | frozenset(env.globals)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template, compiled once, plus the special tokens it refers to."""

    source: str
    bos_token: str
    eos_token: str
    compiled: jinja2.Template = field(init=False, repr=False, compare=False)
    #: The names the template reads, and those a client's kwargs may not set.
    reads: frozenset[str] = field(init=False, repr=False, compare=False)
    reserved: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled, reads, reserved = _compile(self.source)
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "reads", reads)
        object.__setattr__(self, "reserved", reserved)

    @classmethod
    def from_tokenizer_dir(cls, directory: Path) -> ChatTemplate:
        """Load ``chat_template`` (the default one when it is a named list) from ``directory``."""
        path = directory / "tokenizer_config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ChatTemplateError(f"cannot read {path}: {exc}") from None
        template = config.get("chat_template")
        standalone = directory / "chat_template.jinja"
        if template is None and standalone.is_file():
            template = standalone.read_text(encoding="utf-8")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        if not isinstance(template, str) or not template:
            raise ChatTemplateError(f"{path} has no chat_template (string or named 'default')")
        return cls(
            template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        strip_bos: bool = False,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``, by default ending with the assistant's generation
        prompt; ``kwargs`` are further template variables, none of :attr:`reserved`.

        ``strip_bos`` leaves out one leading ``bos_token``, for a tokenizer that adds it itself.
        """
        try:
            text = self.compiled.render(
                **(kwargs or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:
            # Templates index into client-sent messages: any failure (tojson on an Undefined,
            # a missing key, a type error) is the request's, so it is reported, not a 500.
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        # vLLM's own server tokenizes the rendered text without special tokens; the backend
        # tokenizes text_input with them, so a template's BOS would follow the tokenizer's.
        if strip_bos and self.bos_token and text.startswith(self.bos_token):
            return text[len(self.bos_token) :]
        return text


def cut_after_final_message(text: str, final: str) -> str:
    """``text`` cut just after the last message's own text ``final``, leaving that message open
    for the model to continue (what follows it is the template's end of turn)."""
    if not final.strip():
        raise ChatTemplateError("the last message has no text to continue")
    at = text.rfind(final.strip())
    if at < 0:
        raise ChatTemplateError(
            "the chat template does not render the last message's text as sent, so it cannot "
            "be continued"
        )
    # Keep the message's trailing whitespace where the template kept it.
    kept = final.lstrip()
    return text[: at + (len(kept) if text.startswith(kept, at) else len(final.strip()))]
