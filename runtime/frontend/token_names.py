"""How logprobs name a token: its text, or a ``bytes:\\xNN`` form, and its bytes.

vLLM decodes each logprob token on its own, so a token holding part of a UTF-8 sequence (a
byte of an emoji, of most CJK text) comes back as ``""`` or ``"\ufffd"``: distinct tokens look
alike and ``bytes``, which exists to put such tokens back together, would be empty. The
backend's logprobs are keyed by token id, so the names come from the tokenizer's own bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokenizers import Tokenizer

from runtime.constraints.token_bytes import TokenBytes, token_bytes_table

__all__ = ["TokenNames"]


@dataclass(frozen=True)
class TokenNames:
    """Every token id's bytes (``None`` for special tokens, which are named by their text);
    ``by_id`` names every token ``token_id:N`` instead (vLLM's ``return_tokens_as_token_ids``)."""

    table: TokenBytes
    by_id: bool = False

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> TokenNames:
        return cls(token_bytes_table(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True)))

    def for_request(self, by_id: bool | None) -> TokenNames:
        """These names, or the same table naming tokens by id where the request asks for it."""
        return replace(self, by_id=True) if by_id else self

    def name(self, token_id: int | None, text: str) -> tuple[str, bytes]:
        """The logprobs name of a token (its id, and its text as the backend decoded it), and
        its bytes, which stay the token's own when it is named by id."""
        raw = None
        if token_id is not None and 0 <= token_id < len(self.table):
            raw = self.table[token_id]
        if self.by_id and token_id is not None:
            return f"token_id:{token_id}", raw if raw is not None else text.encode("utf-8")
        if raw is None:
            return text, text.encode("utf-8")
        try:
            return raw.decode("utf-8"), raw
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw
