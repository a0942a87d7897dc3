"""Every bad configuration is rejected with a message naming what to change."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, validate_logits_processors_parameters

from runtime.constraints import _engine
from runtime.constraints.catalog import (
    CatalogError,
    load_catalog,
    tokenize_catalog,
    tokenizer_encoder,
)
from runtime.constraints.engine import ConstraintEngine, EngineConfigError, EngineStateError
from runtime.constraints.plan import resolve_constraints
from runtime.constraints.processor import (
    ConstraintLogitsProcessor,
    TokenizerLoadError,
    load_tokenizer,
)
from runtime.constraints.runner_v2 import ConstraintLogitsProcessorV2
from runtime.constraints.schema import ConstraintConfigError, parse_constraints
from tests.constraints.conftest import WORDS, vllm_config
from tests.constraints.mrv2_standin import RequestStatesStandIn, logits_context
from tests.constraints.toy import open_list_rules, word_tokenizer, write_catalog

VOCAB = 40


def _params(config: object) -> SamplingParams:
    return SamplingParams(extra_args={"constraints": config})


def _item_list(**fields: object) -> dict:
    return {"version": 1, "item_list": {"catalog": "films", **fields}}


def _one_state_machine(transition: list[int]) -> dict:
    """A token machine of one accepting state 0 and one ``[state, token, next]`` transition."""
    return {
        "version": 1,
        "token_machine": {"num_states": 1, "accepting_states": [0], "transitions": [transition]},
    }


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        (_item_list(catalog="nope"), "constraints.item_list.catalog", "unknown catalog 'nope'"),
        (
            _item_list(allow=["f1", "zz"]),
            "constraints.item_list.allow[1]",
            "item id 'zz' is not in catalog 'films'",
        ),
        (_item_list(deny=["qq"]), "constraints.item_list.deny[0]", "item id 'qq' is not in"),
        (
            _item_list(min_items=3, max_items=2),
            "constraints.item_list.max_items",
            "min_items (3) must not exceed max_items (2)",
        ),
        (
            _one_state_machine([0, 4, 3]),
            "constraints.token_machine.transitions[0]",
            "states must be in 0..0",
        ),
    ],
)
def test_validate_params_names_the_field(
    toy_dir: Path, config: dict, field: str, fragment: str
) -> None:
    with pytest.raises(ConstraintConfigError) as info:
        ConstraintLogitsProcessor.validate_params(_params(config))
    assert info.value.field == field
    assert fragment in str(info.value)


def test_unknown_catalog_lists_available(toy_dir: Path) -> None:
    with pytest.raises(ConstraintConfigError, match=r"available: films"):
        ConstraintLogitsProcessor.validate_params(_params(_item_list(catalog="nope")))


def test_missing_catalog_directory_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_SERVING_CATALOG_DIR", raising=False)
    with pytest.raises(ConstraintConfigError, match="LLM_SERVING_CATALOG_DIR"):
        ConstraintLogitsProcessor.validate_params(_params(_item_list()))


def test_vllm_turns_the_error_into_a_validation_error(toy_dir: Path) -> None:
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=r"allow\[0\]: item id 'zz'"):
        validate_logits_processors_parameters(
            [ConstraintLogitsProcessor], _params(_item_list(allow=["zz"]))
        )


def test_valid_and_absent_configurations_pass(toy_dir: Path) -> None:
    ConstraintLogitsProcessor.validate_params(_params(_item_list(allow=["f1"], unique=True)))
    ConstraintLogitsProcessor.validate_params(SamplingParams())


def _resolve(toy_dir: Path, config: dict):
    tokenizer = word_tokenizer(WORDS)
    encode = tokenizer_encoder(tokenizer)
    tokenized = tokenize_catalog(load_catalog(toy_dir / "catalogs", "films"), encode)
    return resolve_constraints(
        parse_constraints(config),
        catalogs=lambda name: tokenized,
        encode=encode,
        vocab_size=VOCAB,
        eos_token_id=0,
    )


@pytest.mark.parametrize(
    ("config", "field", "fragment"),
    [
        (
            _item_list(separator="sky"),
            "constraints.item_list.separator",
            "also continues catalog item 'f2'",
        ),
        (
            _item_list(separator="; and", terminator="; end"),
            "constraints.item_list.terminator",
            "both start with token",
        ),
        (_item_list(prefix="</s> ["), "constraints.item_list.prefix", "end-of-sequence"),
        ({"version": 1, "banned_tokens": [3, 400]}, "constraints.banned_tokens[1]", "outside"),
        (
            _one_state_machine([0, 0, 0]),
            "constraints.token_machine.transitions[0]",
            "end of sequence",
        ),
        (
            _one_state_machine([0, 99, 0]),
            "constraints.token_machine.transitions[0]",
            "outside the vocabulary of 40",
        ),
    ],
)
def test_tokenizer_checks_name_the_field(
    toy_dir: Path, config: dict, field: str, fragment: str
) -> None:
    with pytest.raises(ConstraintConfigError) as info:
        _resolve(toy_dir, config)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_catalog_tokenized_for_another_vocabulary_is_refused(toy_dir: Path) -> None:
    """A catalog token at or past the model's vocabulary, or equal to its end of sequence,
    means another tokenizer: both are named on the catalog field."""
    encode = tokenizer_encoder(word_tokenizer(WORDS))
    tokenized = tokenize_catalog(load_catalog(toy_dir / "catalogs", "films"), encode)
    largest = max(t for item in tokenized.tokens for t in item)
    assert tokenized.max_token == largest
    in_catalog_only = min(tokenized.vocabulary - set(encode([", "])[0]))
    for vocab_size, eos in ((largest, 0), (VOCAB, in_catalog_only)):
        with pytest.raises(ConstraintConfigError) as info:
            resolve_constraints(
                parse_constraints(_item_list()),
                catalogs=lambda name: tokenized,
                encode=encode,
                vocab_size=vocab_size,
                eos_token_id=eos,
            )
        assert info.value.field == "constraints.item_list.catalog"
        assert "was it tokenized with this model's tokenizer?" in str(info.value)


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], ":2: duplicate id 'a'"),
        (['{"id": "a", "text": "x"}', '{"id": "b", "text": "x"}'], "same text as 'a'"),
        (["{not json"], ":1: not valid JSON"),
        (['{"id": "a"}'], 'keys "id" and "text"'),
        (['{"id": "a", "text": ""}'], "text of 'a' must be a non-empty string"),
        (['{"id": 3, "text": "x"}'], "id must be a non-empty string"),
        ([], "has no items"),
    ],
)
def test_catalog_file_errors(tmp_path: Path, lines: list[str], fragment: str) -> None:
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path, "c")
    assert fragment in str(info.value)
    assert "c.jsonl" in str(info.value)


def test_catalog_name_and_tokenization_errors(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"catalog name '\.\./x' must use"):
        load_catalog(tmp_path, "../x")
    write_catalog(tmp_path, "c", [("a", "red  sky"), ("b", "red sky")])
    encode = tokenizer_encoder(word_tokenizer(WORDS))
    with pytest.raises(CatalogError, match="items 'a' and 'b' tokenize to the same tokens"):
        tokenize_catalog(load_catalog(tmp_path, "c"), encode)


def _catalog(seqs: list[list[int]], vocab: int = VOCAB) -> _engine.Catalog:
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    tokens = np.asarray([t for s in seqs for t in s], dtype=np.int32)
    return _engine.Catalog(tokens, offsets, vocab)


@pytest.mark.parametrize(
    ("seqs", "fragment"),
    [
        ([[1, 2], [1, 2]], "have the same token sequence"),
        ([[1, 2], [50]], "token 50 is outside the vocabulary of 40"),
        ([[1], []], "catalog item 1 has no tokens"),
    ],
)
def test_native_catalog_errors(seqs: list[list[int]], fragment: str) -> None:
    with pytest.raises(EngineConfigError, match=fragment):
        _catalog(seqs)


def _item_list_args(catalog: _engine.Catalog) -> dict[str, Any]:
    """Arguments of a valid ``Constraint.item_list`` over ``catalog``, for one to be broken."""
    return {
        "catalog": catalog,
        "prefix": [],
        "separator": [5],
        "terminator": [6],
        **open_list_rules(),
        "vocab_size": VOCAB,
    }


def test_native_buffer_and_constraint_errors() -> None:
    with pytest.raises(ValueError, match="offsets must be int64"):
        _engine.Catalog(np.ones(2, np.int32), np.asarray([0, 2], np.int32), VOCAB)
    with pytest.raises(ValueError, match="offsets must start at 0"):
        _engine.Catalog(np.ones(2, np.int32), np.asarray([0, 3], np.int64), VOCAB)
    args = _item_list_args(_catalog([[1, 2], [3]]))
    cases = [
        ({"allowed": np.asarray([7], np.int32)}, "allowed item index 7 is not in the catalog"),
        ({"min_items": 3, "max_items": 2}, r"min_items \(3\) must not exceed max_items \(2\)"),
        ({"separator": []}, "separator must have at least one token"),
        ({"terminator": [5]}, "must start with different tokens"),
        ({"eos_token_id": 40}, "eos_token_id 40 is outside"),
        ({"banned": [-1]}, "banned_tokens: token -1 is outside"),
        ({"prefix": [0]}, "prefix contains the end-of-sequence token"),
        ({"vocab_size": 20}, "compiled for a vocabulary of 40"),
    ]
    for change, fragment in cases:
        with pytest.raises(EngineConfigError, match=fragment):
            _engine.Constraint.item_list(**{**args, **change})
    with pytest.raises(EngineConfigError, match="transitions must have 3 columns"):
        _engine.Constraint.token_machine(1, 0, [0], np.zeros((2, 2), np.int32), 0, [], VOCAB)
    with pytest.raises(EngineConfigError, match="already has a transition on token 4"):
        rows = np.asarray([[0, 4, 0], [0, 4, 0]], np.int32)
        _engine.Constraint.token_machine(1, 0, [0], rows, 0, [], VOCAB)


def test_engine_boundary_errors() -> None:
    with pytest.raises(EngineConfigError, match="max_batch must be at least 1"):
        ConstraintEngine(0, VOCAB, 1)
    with pytest.raises(EngineConfigError, match="num_threads must be at least 1"):
        ConstraintEngine(2, VOCAB, 0)
    engine = ConstraintEngine(2, VOCAB, 2)
    constraint = _engine.Constraint.banned(0, [3], VOCAB)
    with pytest.raises(EngineConfigError, match=r"slot 2 is not in 0..1"):
        engine.add(2, constraint)
    with pytest.raises(EngineConfigError, match="slot -1 is negative"):
        engine.advance(-1, [1])
    with pytest.raises(EngineStateError, match="slot 1 holds no constraint"):
        engine.advance(1, [1])
    with pytest.raises(EngineConfigError, match="the engine has 40"):
        engine.add(0, _engine.Constraint.banned(0, [], 64))
    engine.add(0, constraint)
    with pytest.raises(EngineConfigError, match="same length, got 2 and 1"):
        engine.advance_batch(np.asarray([0, 0], np.int32), np.asarray([1], np.int32))
    with pytest.raises(EngineStateError, match="slot 1 holds no constraint"):
        engine.advance_batch(np.asarray([0, 1], np.int32), np.asarray([1, 1], np.int32))
    with pytest.raises(ValueError, match="tokens must be int32, got int64"):
        engine.advance_batch(np.asarray([0], np.int32), np.asarray([1], np.int64))
    rows = np.asarray([0], np.int32)
    with pytest.raises(ValueError, match="bitmask must be int32, got float32"):
        engine.fill(np.zeros((2, 2), np.float32), rows)
    with pytest.raises(EngineConfigError, match=r"2 int32 words per row \(ceil"):
        engine.fill(np.zeros((2, 3), np.int32), rows)
    with pytest.raises(EngineConfigError, match="row 0 is listed twice"):
        engine.fill(np.zeros((2, 2), np.int32), np.asarray([0, 0], np.int32))
    with pytest.raises(EngineConfigError, match="row 5 is outside the bitmask's 2 rows"):
        engine.fill(np.zeros((2, 2), np.int32), np.asarray([5], np.int32))
    with pytest.raises(EngineConfigError, match="must be C-contiguous"):
        engine.fill(np.zeros((2, 4), np.int32)[:, ::2], rows)
    # A CPU torch tensor is filled in place, without a copy.
    mask = torch.zeros((2, 2), dtype=torch.int32)
    engine.fill(mask, rows)
    assert mask[0].tolist() == [-9, 0xFF]  # all of 0..39 except token 3
    assert mask[1].tolist() == [0, 0]  # unconstrained rows untouched


def test_config_failing_only_with_the_tokenizer_ends_the_request(toy_dir: Path) -> None:
    proc = ConstraintLogitsProcessor(vllm_config(toy_dir, VOCAB, 4), torch.device("cpu"), False)
    bad = {"version": 1, "banned_tokens": [400]}  # passes validate_params, not the vocabulary
    ConstraintLogitsProcessor.validate_params(_params(bad))
    good = _item_list(prefix="[")
    update = BatchUpdate(
        batch_size=2,
        removed=[],
        moved=[],
        added=[(0, _params(bad), [1], []), (1, _params(good), [1], [])],
    )
    proc.update_state(update)
    logits = torch.zeros((2, VOCAB))
    proc.apply(logits)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [WORDS.index("[") + 2]
    assert proc.batch.rejected_requests == 1
    assert not proc.is_argmax_invariant()
    assert json.dumps(good)  # the configuration is plain JSON


def test_engine_starts_without_a_tokenizer_and_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every vLLM engine of the image loads the processor; only catalog requests need the
    # tokenizer, and without one they end instead of crashing the engine.
    write_catalog(tmp_path, "films", [("f1", "red")])
    monkeypatch.setenv("LLM_SERVING_CATALOG_DIR", str(tmp_path))
    proc = ConstraintLogitsProcessor(vllm_config(tmp_path, VOCAB, 2), torch.device("cpu"), False)
    added = [
        (0, _params(_item_list()), [1], []),
        (1, _params({"version": 1, "banned_tokens": [3]}), [1], []),
    ]
    proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[], added=added))
    logits = torch.zeros((2, VOCAB))
    proc.apply(logits)
    assert proc.batch.rejected_requests == 1
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
    assert torch.isinf(logits[1]).nonzero().flatten().tolist() == [3]


def test_malformed_tokenizer_fails_closed_in_both_adapters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tokenizers raises a plain Exception for a malformed file: it must end the constrained
    # request (V1 update_state, V2 apply_staged_writes), never escape into vLLM's engine loop.
    (tmp_path / "tokenizer.json").write_text("{not json")
    write_catalog(tmp_path, "films", [("f1", "red")])
    monkeypatch.setenv("LLM_SERVING_CATALOG_DIR", str(tmp_path))
    proc = ConstraintLogitsProcessor(vllm_config(tmp_path, VOCAB, 2), torch.device("cpu"), False)
    added = [(0, _params(_item_list()), [1], [])]
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=added))
    logits = torch.zeros((1, VOCAB))
    proc.apply(logits)
    assert proc.batch.rejected_requests == 1
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]

    states = RequestStatesStandIn(2, 16, VOCAB)
    v2 = ConstraintLogitsProcessorV2(vllm_config(tmp_path, VOCAB, 2), states)
    idx = states.add_request("r0", [1], [1])
    assert v2.add_request(idx, _params(_item_list()))
    v2.apply_staged_writes()
    logits = torch.zeros((1, VOCAB))
    v2.apply(logits, logits_context(np.asarray([idx], np.int64), states))
    assert v2.batch.rejected_requests == 1
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
    with pytest.raises(TokenizerLoadError, match="cannot be loaded"):
        load_tokenizer(str(tmp_path))


def test_token_machine_size_is_refused_before_allocating() -> None:
    # num_states + 1 wrapped to 0 in uint32 and the first fill read past the offsets; the
    # check comes before the per-state arrays (4 GiB here) are allocated.
    no_rows = np.zeros((0, 3), np.int32)
    with pytest.raises(EngineConfigError, match="num_states 4294967295 exceeds the limit of"):
        _engine.Constraint.token_machine(2**32 - 1, 0, [0], no_rows, 0, [], VOCAB)
    with pytest.raises(EngineConfigError, match=r"num_states 4294967296 is not in 0\.\."):
        _engine.Constraint.token_machine(2**32, 0, [0], no_rows, 0, [], VOCAB)
    machine = _engine.Constraint.token_machine(3, 0, [2], no_rows, 0, [], VOCAB)
    engine = ConstraintEngine(1, VOCAB, 1)
    engine.add(0, machine)
    mask = np.zeros((1, 2), np.int32)
    engine.fill(mask, np.asarray([0], np.int32))
    assert mask.tolist() == [[1, 0]]  # state 0 has no transition and is not accepting: EOS


def _out_of_range_calls() -> list[tuple[str, Callable[[], object]]]:
    engine = ConstraintEngine(2, VOCAB, 1)
    engine.add(0, _engine.Constraint.banned(0, [3], VOCAB))
    native = engine.native
    cat = _catalog([[1, 2], [3]])
    no_rows = np.zeros((0, 3), np.int32)

    def item_list(**change: object) -> object:
        return _engine.Constraint.item_list(**{**_item_list_args(cat), **change})

    return [
        ("active(-1)", lambda: native.active(-1)),
        ("active(2**64)", lambda: native.active(2**64)),
        ("remove(2**63)", lambda: native.remove(2**63)),
        ("reset(-2**70)", lambda: native.reset(-(2**70))),
        ("move(0, 2**64)", lambda: native.move(0, 2**64)),
        ("swap(2**64, 0)", lambda: native.swap(2**64, 0)),
        ("add(2**63)", lambda: native.add(2**63, _engine.Constraint.banned(0, [], VOCAB))),
        ("advance(2**64)", lambda: native.advance(2**64, [1])),
        ("advance tokens", lambda: native.advance(0, [2**40])),
        ("slot_info(-1)", lambda: native.slot_info(-1)),
        ("slot_info(2**64)", lambda: native.slot_info(2**64)),
        ("min_items=-1", lambda: item_list(min_items=-1)),
        ("max_items=2**40", lambda: item_list(max_items=2**40)),
        ("banned=[2**64]", lambda: item_list(banned=[2**64])),
        ("prefix=[-2**40]", lambda: item_list(prefix=[-(2**40)])),
        ("eos_token_id=2**31", lambda: item_list(eos_token_id=2**31)),
        (
            "accepting=[-1]",
            lambda: _engine.Constraint.token_machine(2, 0, [-1], no_rows, 0, [], VOCAB),
        ),
        (
            "initial_state=-1",
            lambda: _engine.Constraint.token_machine(2, -1, [0], no_rows, 0, [], VOCAB),
        ),
        (
            "num_states=-1",
            lambda: _engine.Constraint.token_machine(-1, 0, [0], no_rows, 0, [], VOCAB),
        ),
        ("banned vocab_size", lambda: _engine.Constraint.banned(0, [], 2**31)),
        ("Engine(2**63)", lambda: _engine.Engine(2**63, VOCAB, 1)),
        ("Engine threads", lambda: _engine.Engine(2, VOCAB, 2**64)),
        (
            "Catalog vocab_size",
            lambda: _engine.Catalog(np.ones(1, np.int32), np.asarray([0, 1], np.int64), -(2**33)),
        ),
    ]


def test_out_of_range_integers_are_value_errors() -> None:
    # Negative or huge indices gave pybind11's TypeError on some calls and ValueError on others.
    for name, call in _out_of_range_calls():
        with pytest.raises(EngineConfigError) as info:
            call()
        assert "incompatible function arguments" not in str(info.value), name
    engine = ConstraintEngine(2, VOCAB, 1)
    with pytest.raises(EngineConfigError, match=r"^slot 18446744073709551616 is not in 0\.\.1$"):
        engine.active(2**64)
    with pytest.raises(EngineConfigError, match=r"^min_items -1 is not in 0\.\.4294967295$"):
        _engine.Constraint.item_list(
            _catalog([[1]]), [], [5], [], -1, None, False, None, 0, [], VOCAB
        )
    with pytest.raises(TypeError):
        engine.active(1.0)  # type: ignore[arg-type]  # not an integer at all
    assert engine.native.active(np.int64(1)) is False  # numpy integers pass through __index__
