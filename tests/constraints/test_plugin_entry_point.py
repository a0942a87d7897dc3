"""The entry-point class builds the processor of whichever model runner constructs it."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor, _load_custom_logitsprocs

from runtime.constraints.plugin import ConstraintProcessorEntryPoint
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.runner_v2 import ConstraintLogitsProcessorV2
from tests.constraints.conftest import vllm_config
from tests.constraints.mrv2_standin import RequestStatesStandIn

VOCAB = 40


def test_vllm_loads_the_entry_point_once() -> None:
    loaded = _load_custom_logitsprocs(())
    assert loaded.count(ConstraintProcessorEntryPoint) == 1


def test_v1_constructor_builds_the_v1_processor(toy_dir: Path) -> None:
    processor = ConstraintProcessorEntryPoint(
        vllm_config(toy_dir, VOCAB, 4), torch.device("cpu"), False
    )
    assert type(processor) is ConstraintLogitsProcessor
    assert isinstance(processor, LogitsProcessor)
    assert processor.is_argmax_invariant() is False


def test_v2_constructor_builds_the_runner_v2_adapter(toy_dir: Path) -> None:
    states = RequestStatesStandIn(4, 64, VOCAB)
    processor = ConstraintProcessorEntryPoint(vllm_config(toy_dir, VOCAB, 4), states)
    assert type(processor) is ConstraintLogitsProcessorV2
    assert processor.req_states is states
