"""A catalog (or tokenizer) that fails to load is read once, not at every request that names it:
the failure is kept until its file changes, and each request still gets the same error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from runtime.constraints import catalog as catalog_module
from runtime.constraints import registry as registry_module
from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import CatalogError, load_catalog_cached
from runtime.constraints.processor import LazyEncoder, TokenizerLoadError
from runtime.constraints.registry import CatalogRegistry
from tests.constraints.toy import word_tokenizer, write_catalog

WORDS = ["red", "green", ";"]
VOCAB = 8
LIST = {"version": 1, "item_list": {"catalog": "films", "separator": ";"}}


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[object]:
    """Replace ``module.name`` by a wrapper that records each call; the list of calls."""
    calls: list[object] = []
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _rewrite(path: Path, text: str) -> None:
    """Replace ``path`` as a deploy would (a new file renamed over it)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _batch(directory: Path) -> ConstraintBatch:
    registry = CatalogRegistry(directory, LazyEncoder(str(directory)), VOCAB)
    return ConstraintBatch(
        max_batch=8, vocab_size=VOCAB, registry=registry, default_eos_token_id=0, num_threads=1
    )


def test_a_broken_catalog_is_read_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _counting(monkeypatch, catalog_module, "read_catalog")
    path = tmp_path / "films.jsonl"
    path.write_text('{"id": "a", "text": "red"}\n{"id": "a", "text": "green"}\n')
    errors = []
    for _ in range(5):
        with pytest.raises(CatalogError) as err:
            load_catalog_cached(tmp_path, "films")
        errors.append(str(err.value))
    assert len(reads) == 1
    assert errors == [f"{path}:2: duplicate id 'a'"] * 5
    _rewrite(path, '{"id": "a", "text": "red"}\n{"id": "b", "text": "green"}\n')
    assert load_catalog_cached(tmp_path, "films").ids == ("a", "b")
    assert len(reads) == 2


def test_a_missing_catalog_is_found_once_it_is_added(tmp_path: Path) -> None:
    write_catalog(tmp_path, "colours", [("a", "red")])
    for _ in range(2):
        with pytest.raises(CatalogError, match=r"unknown catalog 'films'.*available: colours$"):
            load_catalog_cached(tmp_path, "films")
    # The error lists the directory, so a catalog added beside it shows in the next one.
    write_catalog(tmp_path, "sizes", [("s", "red")])
    with pytest.raises(CatalogError, match=r"available: colours, sizes$"):
        load_catalog_cached(tmp_path, "films")
    write_catalog(tmp_path, "films", [("f", "green")])
    assert load_catalog_cached(tmp_path, "films").ids == ("f",)


def test_the_engine_reads_a_broken_catalog_once_and_rejects_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    word_tokenizer(WORDS).save(str(tmp_path / "tokenizer.json"))
    path = tmp_path / "films.jsonl"
    path.write_text('{"id": "a", "text": "red"}\nnot json\n')
    reads = _counting(monkeypatch, catalog_module, "read_catalog")
    batch = _batch(tmp_path)
    for slot in range(4):
        batch.add(slot, LIST, [], None)
    assert batch.rejected_requests == 4
    assert len(reads) == 1
    messages = {r.getMessage() for r in caplog.records if "rejected" in r.getMessage()}
    assert len(messages) == 1 and f"{path}:2: not valid JSON" in messages.pop()
    _rewrite(path, '{"id": "a", "text": "red"}\n{"id": "b", "text": "green"}\n')
    batch.add(4, LIST, [], None)
    assert batch.rejected_requests == 4
    assert len(reads) == 2


def test_the_engine_tokenizes_a_failing_catalog_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    word_tokenizer(WORDS).save(str(tmp_path / "tokenizer.json"))
    # Both texts are unknown words: they tokenize to the same <unk> token.
    path = tmp_path / "films.jsonl"
    path.write_text('{"id": "a", "text": "blue"}\n{"id": "b", "text": "sea"}\n')
    tokenized = _counting(monkeypatch, registry_module, "tokenize_catalog")
    batch = _batch(tmp_path)
    for slot in range(3):
        batch.add(slot, LIST, [], None)
    assert batch.rejected_requests == 3
    assert len(tokenized) == 1
    with pytest.raises(CatalogError, match="tokenize to the same tokens"):
        batch.registry.get("films")
    assert len(tokenized) == 1


def test_a_broken_tokenizer_is_parsed_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text("{not json")
    parses = _counting(monkeypatch, Tokenizer, "from_file")
    encoder = LazyEncoder(str(tmp_path))
    errors = []
    for _ in range(3):
        with pytest.raises(TokenizerLoadError) as err:
            encoder(["red"])
        errors.append(str(err.value))
    assert len(parses) == 1
    assert len(set(errors)) == 1 and "cannot be loaded" in errors[0]
    word_tokenizer(WORDS).save(str(tmp_path / "new.json"))
    (tmp_path / "new.json").replace(tokenizer_json)
    assert encoder(["red"]) == [[2]]
    assert len(parses) == 2
