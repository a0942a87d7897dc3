"""Apply an int32 next-token bitmask to logits in place (1 = allowed, bit j%32 of word j//32)."""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["apply_bitmask_inplace", "unpack_bitmask"]

_HAS_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool ``[rows, vocab_size]`` view of an int32 ``[rows, ceil(vocab_size / 32)]`` bitmask."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask_inplace(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None
) -> None:
    """Set ``logits[r, j]`` to -inf for every r in ``rows`` where bit j of ``bitmask[r]`` is 0.

    ``bitmask`` is indexed like ``logits`` and lives on its device, as does ``rows`` (None: every
    row of ``logits``); rows not listed are left alone. Nothing here waits for the device. On
    CUDA with xgrammar installed its kernel does the work, elsewhere a torch path.
    """
    if rows is not None and rows.numel() == 0:
        return
    n, vocab_size = logits.shape
    if logits.is_cuda and _HAS_XGRAMMAR:
        import xgrammar

        # xgrammar's signature says a list of ints, but its kernels take a device tensor as
        # vLLM passes it: a list would be a copy from the device, which waits for it.
        xgrammar.apply_token_bitmask_inplace(
            logits,
            bitmask[:n],
            vocab_size=vocab_size,
            indices=rows,  # type: ignore[arg-type]
        )
        return
    if rows is None:
        logits.masked_fill_(~unpack_bitmask(bitmask[:n], vocab_size), float("-inf"))
        return
    allowed = unpack_bitmask(bitmask.index_select(0, rows), vocab_size)
    selected = logits.index_select(0, rows)
    selected.masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, selected)
