"""`IntervalGate` over vLLM's own cumulative output classes, and where the engine-level
``stream_interval`` is read from in the installed vLLM."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
from vllm.config import SchedulerConfig, VllmConfig
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from runtime.serving_backend.stream_interval import (
    IntervalGate,
    engine_stream_interval,
    request_stream_interval,
)


def _output(*tokens: int, finished: bool = False) -> RequestOutput:
    """A cumulative output whose choice ``i`` has generated ``tokens[i]`` tokens."""
    choices = [
        CompletionOutput(i, "x" * count, list(range(count)), None, None)
        for i, count in enumerate(tokens)
    ]
    return RequestOutput("r", "p", [1], None, choices, finished)


def _sent(gate: IntervalGate, lengths: list[int], last_finished: bool = True) -> list[int]:
    last = len(lengths) - 1
    outputs = [_output(n, finished=last_finished and i == last) for i, n in enumerate(lengths)]
    return [len(o.outputs[0].token_ids) for o in outputs if gate.due(o)]


def test_outputs_go_out_first_then_every_interval_tokens_and_when_finished() -> None:
    # vLLM's DELTA-mode rule: the first output, then whenever interval tokens have piled up.
    assert _sent(IntervalGate(4), list(range(1, 17))) == [1, 5, 9, 13, 16]
    assert _sent(IntervalGate(4), list(range(1, 14))) == [1, 5, 9, 13]


def test_skipped_steps_count_the_tokens_they_carried() -> None:
    # An output may carry several tokens (speculative decoding, vLLM's own merging).
    assert _sent(IntervalGate(3), [2, 3, 6, 7, 8, 11], last_finished=False) == [2, 6, 11]


def test_interval_one_lets_everything_through() -> None:
    assert _sent(IntervalGate(1), [1, 2, 3], last_finished=False) == [1, 2, 3]


def test_the_choice_furthest_along_decides() -> None:
    gate = IntervalGate(2)
    assert gate.due(_output(1, 0))
    assert not gate.due(_output(1, 2))
    assert gate.due(_output(1, 3))


def test_an_interval_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        IntervalGate(0)


def test_a_request_interval_is_clamped_up_to_the_engines() -> None:
    assert request_stream_interval(SamplingParams(max_tokens=4, stream_interval=8), 2) == 8
    assert request_stream_interval(SamplingParams(max_tokens=4, stream_interval=1), 2) == 2
    assert request_stream_interval(SamplingParams(max_tokens=4), 3) == 3


def test_the_engine_interval_is_read_where_the_installed_vllm_keeps_it() -> None:
    # AsyncLLM.vllm_config.scheduler_config.stream_interval, the path read below.
    assert "self.vllm_config = vllm_config" in inspect.getsource(AsyncLLM.__init__)
    assert "scheduler_config" in {f.name for f in dataclasses.fields(VllmConfig)}
    assert "stream_interval" in {f.name for f in dataclasses.fields(SchedulerConfig)}

    class Engine:
        vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(stream_interval=4))

        async def generate(self) -> None:
            return None

    assert engine_stream_interval(Engine().generate) == 4
    # A callable with no engine behind it (an older vLLM, a stand-in) streams every output.
    assert engine_stream_interval(lambda: None) == 1
