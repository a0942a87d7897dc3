"""Token byte tables: byte-level BPE decodes back to the tokenizer's own text, sentencepiece
pieces turn '▁' into a space and <0xNN> into bytes, special tokens have no bytes."""

from __future__ import annotations

import random

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from runtime.constraints.token_bytes import byte_level_alphabet, token_bytes_table
from tests.constraints.decoded_support import toy


def test_byte_level_alphabet_is_gpt2s() -> None:
    assert set(byte_level_alphabet()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(byte_level_alphabet().values()) == list(range(256))
    assert byte_level_alphabet()["Ġ"] == ord(" ")


def test_byte_level_token_bytes_concatenate_to_the_decoded_text() -> None:
    tokenizer, table = toy()
    assert table[0] is None  # </s>, special
    rng = random.Random(5)
    checked = 0
    for _ in range(500):
        ids = [rng.randrange(1, len(table)) for _ in range(rng.randint(1, 6))]
        data = b"".join(table[i] or b"" for i in ids)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a sequence cut inside a multi-byte character
        assert tokenizer.decode(ids) == text, ids
        checked += 1
    assert checked > 100


def test_sentencepiece_pieces_byte_fallback_and_special_tokens() -> None:
    vocab = {"<unk>": 0, "</s>": 1, "▁": 2, "a": 3, "▁a": 4, "<0x41>": 5, "<0xC3>": 6, "é": 7}
    tokenizer = Tokenizer(models.BPE(vocab, [("▁", "a")], unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_special_tokens([AddedToken("</s>", special=True)])
    tokenizer.add_tokens(["<sep>"])
    table = token_bytes_table(tokenizer, 12)
    assert table[1] is None
    assert (table[2], table[3], table[4]) == (b" ", b"a", b" a")
    assert (table[5], table[6], table[7]) == (b"A", b"\xc3", "é".encode())
    assert table[tokenizer.token_to_id("<sep>")] == b"<sep>"
    assert table[10:] == (None, None)
