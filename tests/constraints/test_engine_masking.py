"""The native logits masking against the torch path it replaces on the CPU, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.constraints.engine import ConstraintEngine, EngineConfigError
from runtime.constraints.masking import apply_bitmask_inplace


@pytest.mark.parametrize(("vocab", "columns"), [(64, 64), (70, 70), (1000, 999), (33, 1)])
def test_native_mask_matches_the_torch_path(vocab: int, columns: int) -> None:
    rng = np.random.default_rng(vocab)
    engine = ConstraintEngine(8, vocab, 2)
    bitmask = rng.integers(-(2**31), 2**31, size=(8, engine.words), dtype=np.int64).astype(np.int32)
    bitmask[1] = 0  # whole masked words
    bitmask[2] = -1  # nothing masked
    logits = torch.from_numpy(rng.standard_normal((6, columns)).astype(np.float32))
    rows = np.asarray([0, 1, 2, 5], dtype=np.int32)
    expected = logits.clone()
    apply_bitmask_inplace(expected, torch.from_numpy(bitmask), torch.from_numpy(rows).long())
    engine.mask_logits(logits, bitmask, rows)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_rows_past_the_logits_are_skipped() -> None:
    engine = ConstraintEngine(4, 40, 1)
    bitmask = np.zeros((4, engine.words), dtype=np.int32)
    logits = torch.zeros((2, 40))
    engine.mask_logits(logits, bitmask, np.asarray([1, 3], dtype=np.int32))
    assert torch.isinf(logits[1]).all() and not torch.isinf(logits[0]).any()


def test_native_mask_refuses_what_it_cannot_index() -> None:
    engine = ConstraintEngine(4, 40, 1)
    bitmask = np.zeros((4, engine.words), dtype=np.int32)
    logits = np.zeros((3, 40), dtype=np.float32)
    with pytest.raises(EngineConfigError, match="strictly increasing"):
        engine.mask_logits(logits, bitmask, np.asarray([1, 1], dtype=np.int32))
    with pytest.raises(EngineConfigError, match="outside the bitmask's 4 rows"):
        engine.mask_logits(logits, bitmask, np.asarray([4], dtype=np.int32))
    with pytest.raises(EngineConfigError, match="covers 64 tokens"):
        engine.mask_logits(np.zeros((3, 65), np.float32), bitmask, np.asarray([0], np.int32))
    with pytest.raises(ValueError, match="must be float32, got float64"):
        engine.mask_logits(logits.astype(np.float64), bitmask, np.asarray([0], np.int32))
    with pytest.raises(ValueError, match="writable C-contiguous"):
        engine.mask_logits(np.zeros((40, 3), np.float32).T, bitmask, np.asarray([0], np.int32))
    with pytest.raises(ValueError, match="must be float32"):
        engine.mask_logits(torch.zeros((3, 40)).half(), bitmask, np.asarray([0], np.int32))
    with pytest.raises(ValueError, match="must be contiguous"):
        engine.mask_logits(torch.zeros((40, 3)).t(), bitmask, np.asarray([0], np.int32))


def test_allowed_logits_keep_their_exact_bits() -> None:
    """NaN, infinities and -0.0 pass through an allowed position unchanged; masked ones
    become -inf whatever they held, in words that are partly, wholly and not at all allowed."""
    engine = ConstraintEngine(2, 96, 1)
    specials = np.asarray([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3.5], dtype=np.float32)
    logits = np.resize(specials, (2, 96)).astype(np.float32)
    before = logits.view(np.uint32).copy()
    bitmask = np.asarray([[0x5555_5555, 0, ~0], [~0, 0x0000_0001, 0x7FFF_FFFE]], dtype=np.int64)
    bitmask = bitmask.astype(np.uint32)
    engine.mask_logits(logits, bitmask.view(np.int32), np.asarray([0, 1], dtype=np.int32))
    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little").reshape(2, 96) == 1
    after = logits.view(np.uint32)
    assert np.array_equal(after[allowed], before[allowed])
    assert (after[~allowed] == np.float32(-np.inf).view(np.uint32)).all()
