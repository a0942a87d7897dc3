"""Checks against a vLLM with Model Runner V2's processor interface (``.venv-vllm-next``).

Not collected by the main run (whose vLLM 0.27.1 predates that interface):
``test_runner_v2_vllm_next.py`` runs this file, and the V2 property test, with that venv's
interpreter. vLLM's own loader, validator and builder are called as the V2 model runner calls
them; only ``RequestState`` is a stand-in, because its buffers need CUDA.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import LogitsProcessor as RunnerV1Processor
from vllm.v1.sample.logits_processor import _load_custom_logitsprocs
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as RunnerV2Processor
from vllm.v1.worker.gpu.sample.logits_processor.loader import (
    _load_v2_logitsprocs_plugins,
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)

from runtime.constraints.plugin import ConstraintProcessorEntryPoint
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.runner_v2 import ConstraintLogitsProcessorV2
from tests.constraints.conftest import FILMS, vllm_config
from tests.constraints.mrv2_standin import RequestStatesStandIn, logits_context

NEXT_VLLM = "0.33.0"
VOCAB = 40


def _constraints(**item_list: object) -> SamplingParams:
    spec = {"catalog": "films", "max_items": 2, **item_list}
    return SamplingParams(extra_args={"constraints": {"version": 1, "item_list": spec}})


def test_this_is_the_next_vllm() -> None:
    assert importlib.metadata.version("vllm") == NEXT_VLLM
    assert logits_context.__globals__["LogitsContext"] is LogitsContext


def test_v2_loader_accepts_the_entry_point() -> None:
    assert ConstraintProcessorEntryPoint in _load_v2_logitsprocs_plugins()
    assert issubclass(ConstraintLogitsProcessorV2, RunnerV2Processor)


def test_v2_validator_rejects_bad_constraints_naming_the_field(toy_dir: Path) -> None:
    validate = build_custom_logits_processors_params_validator(())
    validate(_constraints())
    validate(SamplingParams())
    with pytest.raises(VLLMValidationError, match=r"constraints\.item_list\.catalog"):
        validate(_constraints(catalog="nope"))


def test_v2_builder_makes_the_adapter_that_masks(toy_dir: Path) -> None:
    states = RequestStatesStandIn(4, 64, VOCAB)
    config = vllm_config(toy_dir, VOCAB, 4)
    config.speculative_config = None
    processors = build_custom_logits_processors(config, states, is_pooling_model=False)
    (adapter,) = [p for p in processors if isinstance(p, ConstraintLogitsProcessorV2)]
    constrained = states.add_request("a", [3], [3])
    free = states.add_request("b", [3], [3])
    assert adapter.add_request(constrained, _constraints()) is True
    assert adapter.add_request(free, SamplingParams()) is False
    adapter.apply_staged_writes()
    logits = torch.zeros((2, VOCAB))
    adapter.apply(logits, logits_context(np.asarray([free, constrained]), states))
    assert torch.isfinite(logits[0]).all()
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert 0 < len(allowed) <= len(FILMS)


def test_v2_adapter_refuses_speculative_decoding(toy_dir: Path) -> None:
    config = vllm_config(toy_dir, VOCAB, 4)
    config.speculative_config = object()
    with pytest.raises(ValueError, match="speculative decoding"):
        ConstraintProcessorEntryPoint(config, RequestStatesStandIn(4, 64, VOCAB))


def test_v1_runner_of_the_same_vllm_gets_the_v1_processor(toy_dir: Path) -> None:
    (cls,) = [c for c in _load_custom_logitsprocs(()) if c is ConstraintProcessorEntryPoint]
    processor = cls(vllm_config(toy_dir, VOCAB, 4), torch.device("cpu"), False)
    assert isinstance(processor, ConstraintLogitsProcessor)
    assert isinstance(processor, RunnerV1Processor)
