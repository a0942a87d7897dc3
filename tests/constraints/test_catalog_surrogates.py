"""Catalog text that no tokenizer can encode (a JSON-escaped lone surrogate), and what the batch
does with any error a constraint raises when it joins the batch: the request ends, nothing
escapes ``update_state``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import CatalogError, read_catalog
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.registry import CatalogRegistry
from runtime.package import PackageError, build_package
from tests.constraints.conftest import vllm_config
from tests.constraints.toy import word_tokenizer, write_catalog
from tests.runtime.wheelmaker import make_source

VOCAB = 16
EOS = 0
LIST = {"version": 1, "item_list": {"catalog": "films", "separator": ";"}}


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"id": "b", "text": "\\ud800"}', "text '\\ud800'"),
        ('{"id": "b", "text": "red \\udfff sky"}', "text 'red \\udfff sky'"),
        ('{"id": "\\ud83d", "text": "blue"}', "id '\\ud83d'"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_file_and_line(
    tmp_path: Path, line: str, field: str
) -> None:
    path = tmp_path / "films.jsonl"
    path.write_text('{"id": "a", "text": "red"}\n' + line + "\n")
    with pytest.raises(CatalogError) as err:
        read_catalog(path, "films")
    message = str(err.value)
    assert message.startswith(f"{path}:2: {field} is not valid Unicode")
    assert "lone surrogate" in message


def test_an_escaped_surrogate_pair_is_one_character_and_accepted(tmp_path: Path) -> None:
    path = tmp_path / "films.jsonl"
    path.write_text('{"id": "a", "text": "\\ud83c\\udfac red"}\n')
    assert read_catalog(path, "films").texts == ("\N{CLAPPER BOARD} red",)


def test_package_build_refuses_the_catalog(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    (source / "catalogs" / "titles.jsonl").write_text('{"id": "t1", "text": "\\ud800"}\n')
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    message = str(err.value)
    assert "catalogs.0: catalog 'titles' (catalogs/titles.jsonl)" in message
    assert "titles.jsonl:1: text '\\ud800' is not valid Unicode" in message


def _allowed(batch: ConstraintBatch, slot: int) -> list[int]:
    batch.start_fill()
    batch.finish_fill()
    bits = np.unpackbits(batch.bitmask[slot].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:VOCAB]).tolist()


def _failing_encoder(error: Exception) -> object:
    def encode(texts: Sequence[str]) -> list[list[int]]:
        raise error

    return encode


@pytest.mark.parametrize(
    "error",
    [
        # What tokenizers raises for a string it cannot encode (a lone surrogate).
        TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[...]]"),
        RuntimeError("a bug anywhere in building the plan"),
        ValueError("what only the tokenizer can reject"),
    ],
)
def test_any_error_building_the_plan_ends_the_request(
    tmp_path: Path, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    write_catalog(tmp_path, "films", [("a", "red"), ("b", "green")])
    registry = CatalogRegistry(tmp_path, _failing_encoder(error), VOCAB)  # type: ignore[arg-type]
    batch = ConstraintBatch(
        max_batch=2, vocab_size=VOCAB, registry=registry, default_eos_token_id=EOS
    )
    batch.add(1, LIST, [], EOS)
    assert batch.rejected_requests == 1
    assert _allowed(batch, 1) == [EOS]
    assert str(error) in caplog.text
    # Only a bug carries its traceback into the log.
    assert ("Traceback" in caplog.text) == (not isinstance(error, ValueError))


def test_processor_survives_a_catalog_that_slipped_past_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's case: the real tokenizer's TypeError for a lone surrogate (which
    read_catalog now refuses, so it is fed to the tokenizer directly) ends that request, not
    vLLM's engine loop."""
    word_tokenizer(["red", "green", ";"]).save(str(tmp_path / "tokenizer.json"))
    write_catalog(tmp_path, "films", [("a", "red"), ("b", "green")])
    monkeypatch.setenv("LLM_SERVING_CATALOG_DIR", str(tmp_path))
    params = SamplingParams(extra_args={"constraints": LIST})
    ConstraintLogitsProcessor.validate_params(params)
    monkeypatch.setattr(
        "runtime.constraints.registry.tokenize_catalog",
        lambda catalog, encode: encode(["\ud800"]),
    )
    processor = ConstraintLogitsProcessor(vllm_config(tmp_path, 8, 2), torch.device("cpu"), False)
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1], []))
    processor.update_state(builder.get_and_reset(1))
    logits = processor.apply(torch.zeros((1, 8)))
    assert processor.batch.rejected_requests == 1
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
