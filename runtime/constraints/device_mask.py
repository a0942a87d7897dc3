"""Masking logits on an accelerator from the batch's host bitmask, never waiting for the device.

vLLM's V1 engine schedules and prepares the next step while the device still runs the current
one (async scheduling, on by default), so a processor that waits for the device in
``update_state`` or ``apply`` holds the engine's loop for the rest of a forward pass at every
step. Here nothing waits: the host bitmask is double-buffered, so a step's fill writes the
buffer whose copy to the device was queued two steps earlier (its event is checked, and has
long completed), and the row indices reach the device by a non-blocking copy from pinned memory.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.masking import apply_bitmask_inplace

__all__ = ["HOST_BITMASKS", "DeviceMask"]

#: Host bitmask buffers a batch masked on a device needs: one filling, one being copied.
HOST_BITMASKS = 2


class DeviceMask:
    """Copies the step's bitmask rows to ``device`` and masks the logits there.

    ``batch`` must hold :data:`HOST_BITMASKS` buffers; call :meth:`before_fill` before each
    ``start_fill`` and :meth:`apply` with ``finish_fill``'s rows.
    """

    def __init__(self, batch: ConstraintBatch, device: torch.device, *, pin_memory: bool) -> None:
        if batch.bitmask_count < HOST_BITMASKS:
            raise ValueError(
                f"a batch masked on {device} needs {HOST_BITMASKS} host bitmasks, "
                f"it has {batch.bitmask_count}"
            )
        self.batch = batch
        self.device = device
        self.pin_memory = pin_memory
        self._bitmask = torch.empty_like(batch.bitmask, device=device)
        #: Per host buffer, the event recorded after the last copy that read it (CUDA only).
        self._copied: list[torch.cuda.Event | None] = [None] * batch.bitmask_count

    def before_fill(self) -> None:
        """Point the batch at the buffer its next fill may overwrite."""
        index = self.batch.rotate_bitmask()
        copied = self._copied[index]
        if copied is not None:
            # Queued two steps ago: the engine has read that step's sampled tokens since, so
            # this returns at once unless the device runs more than a step behind.
            copied.synchronize()

    def apply(self, logits: torch.Tensor, rows: np.ndarray) -> None:
        """Mask ``logits`` (on ``device``) in place for ``rows`` (ascending, int32)."""
        n = logits.shape[0]
        rows = rows[: np.searchsorted(rows, n)]
        if rows.size == 0:
            return
        self._bitmask[:n].copy_(self.batch.bitmask[:n], non_blocking=True)
        if self.device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
            self._copied[self.batch.bitmask_index] = copied
        index = None
        if rows.size < n:
            host = torch.tensor(rows, dtype=torch.int64, pin_memory=self.pin_memory)
            index = host.to(self.device, non_blocking=True)
        apply_bitmask_inplace(logits, self._bitmask, index)
