"""Token-id prompts and inputs: Triton's vLLM backend takes text only, so a list of token ids
goes as the text that the backend's tokenizer turns back into exactly those ids, or is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from tokenizers import Tokenizer

from runtime.frontend.errors import InvalidRequestError
from runtime.frontend.state import FrontendState

__all__ = ["check_token_ids", "prompt_texts"]


def _added(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text of its own (a BOS, BERT's CLS/SEP)."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    start = next(i for i in range(len(full)) if full[i : i + len(plain)] == plain)
    return full[:start], full[start + len(plain) :]


def check_token_ids(vocab: int, ids: Sequence[int], where: str, param: str) -> None:
    """Refuse an id outside the model's vocabulary (``vocab`` ids), naming its position."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise InvalidRequestError(
                f"{where}[{i}] is {token}, not a token id of the model's vocabulary "
                f"(0 to {vocab - 1})",
                param=param,
            )


def _text_of(
    state: FrontendState, added: tuple[list[int], list[int]], ids: list[int], where: str, param: str
) -> str:
    if not ids:
        raise InvalidRequestError(f"{where} is an empty token list; send some tokens", param=param)
    check_token_ids(state.tokenizer.get_vocab_size(), ids, where, param)
    prefix, suffix = added
    core = ids
    if ids[: len(prefix)] == prefix and (not suffix or ids[-len(suffix) :] == suffix):
        core = ids[len(prefix) : len(ids) - len(suffix)]
    text = state.tokenizer.decode(core, skip_special_tokens=False)
    if state.prompt_ids(text) != ids:
        adds = [f"starting with {prefix}"] if prefix else []
        adds += [f"ending with {suffix}"] if suffix else []
        own = f" ({' and '.join(adds)}, which it adds itself)" if adds else ""
        raise InvalidRequestError(
            f"{where} cannot reach the model as sent: the backend takes text, and these ids do "
            "not tokenize back from text to themselves; send text, or the ids the model's "
            f"tokenizer gives for a text{own}",
            param=param,
        )
    return text


def prompt_texts(
    state: FrontendState,
    value: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
    param: str,
) -> list[str]:
    """``value`` (one text, texts, one token-id list or several) as one text per prompt."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        lists: list[tuple[str, object]] = [(param, value)]
    else:
        lists = [(f"{param}[{i}]", item) for i, item in enumerate(value)]
    added = _added(state.tokenizer) if any(not isinstance(v, str) for _, v in lists) else ([], [])
    return [
        v if isinstance(v, str) else _text_of(state, added, list(cast(Sequence[int], v)), w, param)
        for w, v in lists
    ]
