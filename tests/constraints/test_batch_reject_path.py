"""The fail-closed path of ``ConstraintBatch.add``: a request whose constraint cannot be built
ends with a token that ends it, whatever its end-of-sequence id, and nothing it does raises out
of ``update_state``."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import tokenizer_encoder
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.registry import CatalogRegistry
from tests.constraints.conftest import vllm_config
from tests.constraints.toy import word_tokenizer

VOCAB = 8
BANNED = {"version": 1, "banned_tokens": [3]}


def _batch(tmp_path: Path, default_eos: int | None) -> ConstraintBatch:
    encode = tokenizer_encoder(word_tokenizer(["red", "green", ";"]))
    return ConstraintBatch(
        max_batch=2,
        vocab_size=VOCAB,
        registry=CatalogRegistry(tmp_path, encode, VOCAB),
        default_eos_token_id=default_eos,
    )


def _allowed(batch: ConstraintBatch, slot: int) -> list[int]:
    batch.start_fill()
    batch.finish_fill()
    bits = np.unpackbits(batch.bitmask[slot].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:VOCAB]).tolist()


def test_an_eos_outside_the_vocabulary_ends_with_the_models(tmp_path: Path) -> None:
    """The reviewer's case: the request's EOS is the reason its plan was refused; the fallback
    built from it raised EngineConfigError out of update_state."""
    word_tokenizer(["red", "green", ";"]).save(str(tmp_path / "tokenizer.json"))
    params = SamplingParams(extra_args={"constraints": BANNED})
    params._eos_token_id = VOCAB + 2
    processor = ConstraintLogitsProcessor(
        vllm_config(tmp_path, VOCAB, 4), torch.device("cpu"), False
    )
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1], []))
    processor.update_state(builder.get_and_reset(1))
    logits = processor.apply(torch.zeros((1, VOCAB)))
    assert processor.batch.rejected_requests == 1
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]  # the model's EOS


@pytest.mark.parametrize(
    ("eos", "default_eos", "stops", "end"),
    [
        (None, None, {6, 5}, 5),  # no EOS at all: the lowest stop token ends it
        (VOCAB + 2, VOCAB, {VOCAB + 1, 4}, 4),  # every EOS outside the vocabulary
        (7, None, {5}, 7),  # a valid EOS of the request comes first
    ],
)
def test_the_first_end_token_inside_the_vocabulary_ends_the_request(
    tmp_path: Path, eos: int | None, default_eos: int | None, stops: set[int], end: int
) -> None:
    batch = _batch(tmp_path, default_eos)
    batch.add(1, {"version": 1, "item_list": {"catalog": "missing"}}, [], eos, stops)
    assert batch.rejected_requests == 1
    assert _allowed(batch, 1) == [end]


def test_without_any_end_token_it_runs_on_one_fixed_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Documented choice: nothing can end it early, and it fails closed on token 0 (never an
    all -inf row, never the model's unconstrained text)."""
    batch = _batch(tmp_path, None)
    with caplog.at_level(logging.ERROR, logger="runtime.constraints.batch"):
        batch.add(0, BANNED, [], None, {VOCAB + 4})
    assert batch.rejected_requests == 1
    assert _allowed(batch, 0) == [0]
    assert "cannot end at once" in caplog.text and f"[{VOCAB + 4}]" in caplog.text


def test_a_fallback_that_cannot_be_built_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    batch = _batch(tmp_path, 0)
    batch.add(0, BANNED, [], 0)  # a request in the slot before: it must not keep its row

    def broken(*args: Any) -> Any:
        raise MemoryError("no memory for the fallback")

    fake = SimpleNamespace(Constraint=SimpleNamespace(token_machine=broken))
    monkeypatch.setattr("runtime.constraints.batch._engine", fake)
    batch.add(0, {"version": 2}, [], 0)
    assert batch.rejected_requests == 1
    assert batch.constrained_rows().tolist() == []
    assert "no memory for the fallback" in caplog.text
