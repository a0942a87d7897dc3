"""`check_sampling_parameters` against the stock backend's own ``TritonSamplingParams.from_dict``
(the r26.01 source under ``shared/reference``): it refuses exactly what the stock code cannot
build, and says why."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest
from vllm import SamplingParams

from runtime.serving_backend.sampling_parameters import (
    InvalidSamplingParameters,
    check_sampling_parameters,
    int_logit_bias,
)
from tests.support.real_triton import STOCK_BACKEND_SOURCE

ACCEPTED = [
    "{}",
    '{"max_tokens": 4, "temperature": 0.7, "n": 2}',
    # The stock code converts strings by SamplingParams' annotations (int | None too).
    '{"max_tokens": "4", "temperature": "0.5", "stream_interval": "2"}',
    '{"stop": ["\\n"], "seed": 7, "lora_name": "adapter", "prompt_logprobs": 0}',
    '{"structured_outputs": "{\\"json\\": {\\"type\\": \\"object\\"}}"}',
]
REFUSED = [
    ('{"temperature": -1}', "temperature must be non-negative"),
    ('{"max_token": 4}', "max_token"),
    ('{"top_p": "high"}', "high"),
    ('{"n": 0}', "n must be at least 1"),
    ('{"n": 2, "temperature": 0}', "greedy"),
    ('{"structured_outputs": "not json"}', "invalid sampling parameters"),
    ('{"structured_outputs": {"choice": ["a", "b"]}}', "must be a string holding the JSON"),
]


@pytest.fixture(scope="module")
def stock_utils() -> ModuleType:
    path = STOCK_BACKEND_SOURCE / "utils" / "vllm_backend_utils.py"
    spec = importlib.util.spec_from_file_location("_reference_vllm_backend_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Logger:
    def log_error(self, message: str) -> None:
        self.error = message


def _stock_builds(stock_utils: ModuleType, text: str) -> bool:
    return stock_utils.TritonSamplingParams.from_dict(text, _Logger()) is not None


@pytest.mark.parametrize("text", ACCEPTED)
def test_what_the_stock_code_builds_is_accepted(stock_utils: ModuleType, text: str) -> None:
    assert _stock_builds(stock_utils, text)
    assert check_sampling_parameters(text) == json.loads(text)


@pytest.mark.parametrize(("text", "reason"), REFUSED)
def test_what_the_stock_code_cannot_build_is_refused_with_vllms_reason(
    stock_utils: ModuleType, text: str, reason: str
) -> None:
    assert not _stock_builds(stock_utils, text)
    with pytest.raises(InvalidSamplingParameters, match=reason):
        check_sampling_parameters(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("max_tokens=4", "not JSON"), ("[1]", "must be a JSON object, got list"), ("4", "got int")],
)
def test_json_that_is_no_object_is_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidSamplingParameters, match=reason):
        check_sampling_parameters(text)


def test_logit_bias_keys_become_token_ids_or_are_refused_by_name() -> None:
    # The stock code builds SamplingParams from JSON, so the keys arrive as strings; the real
    # engine refused them (tests/frontend/test_frontend_field_table.py, logit_bias on real).
    bias: dict[Any, float] = {"3": 100, "17": -5, "-1": 1}
    params = SamplingParams(max_tokens=3, logit_bias=bias)
    assert int_logit_bias(params).logit_bias == {3: 100, 17: -5, -1: 1}
    assert int_logit_bias(SamplingParams(max_tokens=3)).logit_bias is None
    # vLLM failed these with an empty message ("Error generating stream: ").
    with pytest.raises(InvalidSamplingParameters, match=r"token ids, got \['abc', '1.5'\]"):
        check_sampling_parameters('{"logit_bias": {"abc": 1, "1.5": 2, "4": 3}}')
