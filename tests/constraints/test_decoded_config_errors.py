"""Decoded matching is declared per catalog (manifest -> sidecar -> catalog); every bad value or
ambiguous piece is refused with a message that names the field."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from runtime.constraints.catalog import CatalogError, load_catalog, load_catalog_cached
from runtime.constraints.plan import check_catalog_fields, resolve_constraints
from runtime.constraints.schema import ConstraintConfigError, parse_constraints
from runtime.entrypoint.render import link_catalogs
from runtime.package.manifest import Catalog as ManifestCatalog
from tests.constraints.decoded_support import EOS, plan_for, table_of, tokenize, toy_tokenizer
from tests.constraints.toy import write_catalog, write_matching

ITEMS = [("a", "a"), ("ab", "a, b"), ("c", "c")]


def test_manifest_declares_matching_per_catalog_and_rejects_other_values() -> None:
    assert ManifestCatalog(name="films", path="c/films.jsonl").matching == "canonical"
    assert ManifestCatalog(name="films", path="f.jsonl", matching="decoded").matching == "decoded"
    with pytest.raises(ValidationError) as info:
        ManifestCatalog.model_validate({"name": "films", "path": "f.jsonl", "matching": "bytes"})
    assert info.value.errors()[0]["loc"] == ("matching",)
    assert "'canonical' or 'decoded'" in str(info.value)


def test_entrypoint_carries_the_mode_into_the_catalog_directory(tmp_path: Path) -> None:
    unpacked = tmp_path / "pkg"
    unpacked.mkdir()
    write_catalog(unpacked, "films", [("f1", "red")])
    write_catalog(unpacked, "songs", [("s1", "blue")])
    manifest = SimpleNamespace(
        catalogs=[
            ManifestCatalog(name="films", path="films.jsonl", matching="decoded"),
            ManifestCatalog(name="songs", path="songs.jsonl"),
        ]
    )
    folder = link_catalogs(manifest, unpacked, tmp_path / "catalogs")  # type: ignore[arg-type]
    assert load_catalog(folder, "films").matching == "decoded"
    assert load_catalog(folder, "songs").matching == "canonical"
    assert not (folder / "songs.meta.json").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"matching": "bytes"}',
            "field 'matching' must be one of canonical, decoded, got 'bytes'",
        ),
        ('{"matching": "decoded", "mode": 1}', 'the only key "matching"'),
        ("[1]", 'the only key "matching"'),
        ("{", "cannot read the catalog metadata"),
    ],
)
def test_bad_sidecar_is_refused_naming_the_file_and_field(
    tmp_path: Path, content: str, expected: str
) -> None:
    write_catalog(tmp_path, "films", [("f1", "red")])
    (tmp_path / "films.meta.json").write_text(content)
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path, "films")
    assert expected in str(info.value)
    assert "films.meta.json" in str(info.value)
    # validate_params reports it on the catalog field of the request.
    spec = parse_constraints({"version": 1, "item_list": {"catalog": "films"}})
    with pytest.raises(ConstraintConfigError) as config:
        check_catalog_fields(spec, tmp_path)
    assert config.value.field == "constraints.item_list.catalog"
    assert expected in str(config.value)


def test_a_rewritten_sidecar_is_read_again(tmp_path: Path) -> None:
    write_catalog(tmp_path, "films", [("f1", "red")])
    assert load_catalog_cached(tmp_path, "films").matching == "canonical"
    write_matching(tmp_path, "films", "decoded")
    assert load_catalog_cached(tmp_path, "films").matching == "decoded"


def test_a_catalog_rewritten_within_one_mtime_tick_is_read_again(tmp_path: Path) -> None:
    path = write_catalog(tmp_path, "films", [("f1", "red")])
    before = path.stat()
    assert load_catalog_cached(tmp_path, "films").ids == ("f1",)
    write_catalog(tmp_path, "films", [("f1", "red"), ("f2", "blue")])
    # As if in the same tick of the kernel's clock: the mtime did not move.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert load_catalog_cached(tmp_path, "films").ids == ("f1", "f2")


@pytest.mark.parametrize(
    ("piece", "value", "message"),
    [
        ("separator", ",", "first byte 44 also continues catalog item 'a'"),
        ("terminator", ", then", "first byte 44 also continues catalog item 'a'"),
        ("terminator", "; end", "terminator and separator both start with ';'"),
    ],
)
def test_ambiguous_pieces_are_refused_in_decoded_mode(piece: str, value: str, message: str) -> None:
    tokenizer = toy_tokenizer()
    tokenized = tokenize(ITEMS, tokenizer, "decoded")
    spec = {"catalog": "cat", "separator": ";", piece: value}
    with pytest.raises(ConstraintConfigError) as info:
        plan_for({"version": 1, "item_list": spec}, tokenized, tokenizer, table_of(tokenizer))
    assert info.value.field == f"constraints.item_list.{piece}"
    assert message in str(info.value)


def test_decoded_catalog_needs_the_token_byte_table() -> None:
    tokenizer = toy_tokenizer()
    tokenized = tokenize(ITEMS, tokenizer, "decoded")
    with pytest.raises(ConstraintConfigError) as info:
        resolve_constraints(
            parse_constraints({"version": 1, "item_list": {"catalog": "cat", "separator": ";"}}),
            catalogs=lambda name: tokenized,
            encode=lambda texts: [[5] for _ in texts],
            vocab_size=tokenizer.get_vocab_size(),
            eos_token_id=EOS,
        )
    assert info.value.field == "constraints.item_list.catalog"
    assert "token bytes" in str(info.value)


def test_validate_params_refuses_ambiguous_pieces_before_the_batch(tmp_path: Path) -> None:
    write_catalog(tmp_path, "cat", ITEMS)
    write_matching(tmp_path, "cat", "decoded")
    good = parse_constraints({"version": 1, "item_list": {"catalog": "cat", "separator": ";"}})
    check_catalog_fields(good, tmp_path)
    bad = parse_constraints({"version": 1, "item_list": {"catalog": "cat", "separator": ", "}})
    with pytest.raises(ConstraintConfigError) as info:
        check_catalog_fields(bad, tmp_path)
    assert info.value.field == "constraints.item_list.separator"
    assert "continues catalog item 'a'" in str(info.value)
