"""Fixtures for the constraint tests: a toy tokenizer, catalogs on disk, a vLLM-shaped config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from runtime.constraints.processor import ConstraintLogitsProcessor
from tests.constraints.toy import word_tokenizer, write_catalog

WORDS = ["red", "green", "blue", "sky", "sea", "moon", "[", "]", ";", "and", ".", "end", "list:"]
FILMS = [
    ("f1", "red sky"),
    ("f2", "red"),
    ("f3", "blue sea moon"),
    ("f4", "green"),
    ("f5", "red sea"),
]


def vllm_config(tokenizer_dir: Path, vocab_size: int, max_num_seqs: int) -> SimpleNamespace:
    """The parts of vLLM's VllmConfig the processors read (the real one needs a model)."""
    model = SimpleNamespace(
        get_vocab_size=lambda: vocab_size,
        tokenizer=str(tokenizer_dir),
        hf_config=SimpleNamespace(eos_token_id=0),
    )
    return SimpleNamespace(
        model_config=model, scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs)
    )


class DevicePathOnHost(ConstraintLogitsProcessor):
    """The processor as it runs on an accelerator (double-buffered host bitmask, copies, the
    torch masking path), with the CPU standing in for the device."""

    @staticmethod
    def masks_on_device(device: torch.device) -> bool:
        return True


@pytest.fixture
def toy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model directory with tokenizer.json and catalogs/films.jsonl, set as catalog dir."""
    tokenizer = word_tokenizer(WORDS)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    write_catalog(catalogs, "films", FILMS)
    monkeypatch.setenv("LLM_SERVING_CATALOG_DIR", str(catalogs))
    return tmp_path
