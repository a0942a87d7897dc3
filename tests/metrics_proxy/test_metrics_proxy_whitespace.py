"""What separates the tokens of Triton's text: spaces and tabs only.

Prometheus's parsers (prometheus/common's expfmt ``TextParser``, the server's ``promlex.l``)
split a line on spaces and tabs and nothing else; any other character, Unicode or ASCII
whitespace included, belongs to a token, and no name, value or timestamp holds one. The proxy's
parser of Triton's text must agree, or it would pass on lines Prometheus refuses a scrape over.
"""

from __future__ import annotations

import pytest

from runtime.metrics_proxy.triton import Family, TritonScrapeError, parse_text_exposition

# What Python's str.split() and str.strip() take for whitespace, which the format does not.
_OTHER_SPACES = ["\u00a0", "\u2003", "\u3000", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\r"]


def _python_view(families: list[Family]) -> dict:
    return {
        f.name: (f.type, f.help, {(s.name, s.labels): s.value for s in f.samples}) for f in families
    }


def _one(typ: str, value: float = 1.0, labels: tuple = (), help_text: str = "") -> dict:
    return {"a": (typ, help_text, {("a", labels): value})}


_ACCEPTED = [
    ("a\t1\n", _one("untyped")),
    ("a \t 1\t 1700000000000 \t\n", _one("untyped")),
    ("a 1 -5\n", _one("untyped")),
    ("a 1 +9223372036854775807\n", _one("untyped")),
    ("a 1 -9223372036854775808\n", _one("untyped")),
    (f"a 1 {'0' * 5000}1\n", _one("untyped")),
    ("a 1\r\n", _one("untyped")),
    ('a{b="c"}\t1\n', _one("untyped", labels=(("b", "c"),))),
    ('a{\tb\t=\t"c"\t,\td = "e" \t}\t2\n', _one("untyped", 2.0, (("b", "c"), ("d", "e")))),
    # Inside a label value or help text they are text, kept as they are.
    ('a{b="x\u00a0y\x0b\u3000"} 1\n', _one("untyped", labels=(("b", "x\u00a0y\x0b\u3000"),))),
    ("# HELP a x\u00a0y\x0cz\na 1\n", _one("untyped", help_text="x\u00a0y\x0cz")),
    # Tabs separate a comment's tokens too.
    ("# TYPE a\tgauge\na 1\n", _one("gauge")),
    ("#\tTYPE\t a \t gauge \t\na 1\n", _one("gauge")),
    ("# HELP\ta\tsome help\na 1\n", _one("untyped", help_text="some help")),
]

_MALFORMED = [
    *(f"a{c}1\n" for c in _OTHER_SPACES),
    *(f"a 1{c}\n" for c in _OTHER_SPACES if c != "\r"),
    *(f"a 1{c}123\n" for c in _OTHER_SPACES),
    *(f"a 1 {c}123\n" for c in _OTHER_SPACES),
    *(f"a 1 123{c}\n" for c in _OTHER_SPACES if c != "\r"),
    *(f'a{{b="c"}}{c}1\n' for c in _OTHER_SPACES),
    *(f'a{{{c}b="c"}} 1\n' for c in _OTHER_SPACES),
    *(f'a{{b{c}="c"}} 1\n' for c in _OTHER_SPACES),
    *(f'a{{b={c}"c"}} 1\n' for c in _OTHER_SPACES),
    *(f'a{{b="c"{c}}} 1\n' for c in _OTHER_SPACES),
    *(f'a{{b="c",{c}d="e"}} 1\n' for c in _OTHER_SPACES),
    *(f"{c}a 1\n" for c in _OTHER_SPACES),
    *(f"# TYPE a gauge{c}x\n" for c in _OTHER_SPACES),
    *(f"# TYPE a gauge{c}\n" for c in _OTHER_SPACES if c != "\r"),
    *(f"# TYPE a {c}gauge\n" for c in _OTHER_SPACES),
    # What else Python's float() takes and the format does not: underscores, other digits.
    "a 1_0\n",
    "a \u0661\n",
    "a \uff11\n",
    # A timestamp is an integer, and nothing follows it.
    "a 1 1.5\n",
    "a 1 x\n",
    "a 1 2 3\n",
    "a 1 9223372036854775808\n",
    "a 1 -9223372036854775809\n",
    f"a 1 {'9' * 5000}\n",
    "a 1 +-5\n",
]


@pytest.mark.parametrize(("text", "expected"), _ACCEPTED)
def test_spaces_and_tabs_separate_tokens(text: str, expected: dict) -> None:
    assert _python_view(parse_text_exposition(text)) == expected


@pytest.mark.parametrize("text", _MALFORMED)
def test_other_whitespace_between_tokens_fails(text: str) -> None:
    with pytest.raises(TritonScrapeError, match="line 1") as info:
        parse_text_exposition(text)
    assert info.value.reason == "parse"
