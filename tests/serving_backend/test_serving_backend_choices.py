"""`ChoiceMerger` over vLLM's own output classes, in the order vLLM V1 emits ``n > 1`` outputs:
only the choices that advanced, each naming itself by ``index``."""

from __future__ import annotations

from vllm.outputs import CompletionOutput, RequestOutput

from runtime.serving_backend.choices import ChoiceMerger


def _choice(index: int, text: str, finish: str | None = None) -> CompletionOutput:
    tokens = list(range(len(text)))
    return CompletionOutput(index, text, tokens, None, None, finish_reason=finish)


def _output(*choices: CompletionOutput, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", "p", [1, 2], None, list(choices), finished)


def test_each_output_holds_every_choice_in_order() -> None:
    merger = ChoiceMerger(3)
    first = merger.merge(_output(_choice(1, "b")))
    assert [(c.index, c.text) for c in first.outputs] == [(0, ""), (1, "b"), (2, "")]
    second = merger.merge(_output(_choice(2, "x"), _choice(0, "a", "stop")))
    assert [(c.index, c.text, c.finish_reason) for c in second.outputs] == [
        (0, "a", "stop"),
        (1, "b", None),
        (2, "x", None),
    ]
    # The last output holds only the choice that finished last; earlier ones are kept.
    last = merger.merge(_output(_choice(1, "bcd", "length"), finished=True))
    assert [(c.text, c.finish_reason) for c in last.outputs] == [
        ("a", "stop"),
        ("bcd", "length"),
        ("x", None),
    ]
    assert last.finished and last.prompt_token_ids == [1, 2]


def test_one_choice_is_handed_on_unchanged() -> None:
    output = _output(_choice(0, "a"))
    assert ChoiceMerger(1).merge(output) is output
