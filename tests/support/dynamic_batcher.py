"""A stand-in for Triton's dynamic batcher and default scheduler, for the repository models that
the KServe stand-in executes (:mod:`tests.support.repository_models`).

Triton's schedulers run only inside ``tritonserver``, whose pip build here cannot load the
backends these models need. This one keeps what a test or a benchmark can observe: with
dynamic batching, requests queued for a model are gathered (up to ``max_batch_size`` rows,
waiting at most ``max_queue_delay_microseconds`` for more) into one execution whose rows are
split back; without it each request executes alone. Each model instance executes one batch at a
time. It never runs in product code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Execute", "Scheduler", "Tensors"]

Tensors = dict[str, np.ndarray]
"""Tensors by name; with a batch dimension, axis 0 holds the rows."""

Execute = Callable[[Tensors], Tensors]
"""One execution of a model (a library call), run in a worker thread."""


@dataclass
class _Pending:
    inputs: Tensors
    rows: int
    future: asyncio.Future[Tensors]

    def batch_key(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """Requests batch together only when names, types and per-row shapes agree, as in
        Triton (no ragged batching here)."""
        return tuple(
            (name, value.dtype.str, value.shape[1:]) for name, value in sorted(self.inputs.items())
        )


@dataclass
class Scheduler:
    """Executes one model's requests on ``instances`` workers, batching when
    ``max_batch_size`` > 0; ``batch_sizes`` records the rows of every execution, in order."""

    execute: Execute
    instances: int = 1
    max_batch_size: int = 0
    """0: every request executes alone (Triton's default scheduler)."""
    max_queue_delay_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    _pending: deque[_Pending] = field(default_factory=deque)
    _arrived: asyncio.Event | None = None
    _workers: list[asyncio.Task[None]] = field(default_factory=list)

    async def infer(self, inputs: Tensors) -> Tensors:
        """Queue one request and return its rows of the execution that ran it."""
        if self._arrived is None:
            # Created here, not in __init__: the queue lives on the server's event loop.
            self._arrived = asyncio.Event()
            self._workers = [
                asyncio.ensure_future(self._work(self._arrived)) for _ in range(self.instances)
            ]
        rows = next(iter(inputs.values())).shape[0] if self.max_batch_size and inputs else 1
        future: asyncio.Future[Tensors] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(inputs, rows, future))
        self._arrived.set()
        return await future

    async def _work(self, arrived: asyncio.Event) -> None:
        while True:
            batch = await self._gather(arrived)
            batch = [p for p in batch if not p.future.done()]  # a client that went away
            if not batch:
                continue
            self.batch_sizes.append(sum(p.rows for p in batch))
            merged = (
                batch[0].inputs
                if len(batch) == 1
                else {
                    name: np.concatenate([p.inputs[name] for p in batch])
                    for name in batch[0].inputs
                }
            )
            try:
                # A worker thread: the event loop keeps accepting (and queueing) requests
                # while the library runs, which is what lets the next batch form.
                outputs = await asyncio.to_thread(self.execute, merged)
            except Exception as exc:  # the backend's error goes to every request of the batch
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            if len(batch) == 1:  # also a model without a batch dimension: nothing to split
                if not batch[0].future.done():
                    batch[0].future.set_result(outputs)
                continue
            start = 0
            for pending in batch:
                end = start + pending.rows
                if not pending.future.done():
                    pending.future.set_result(
                        {name: value[start:end] for name, value in outputs.items()}
                    )
                start = end

    async def _gather(self, arrived: asyncio.Event) -> list[_Pending]:
        """The next execution's requests: the oldest one, then (batching) every compatible one
        that fits, waiting up to the queue delay for more."""
        while not self._pending:
            arrived.clear()
            await arrived.wait()
        first = self._pending.popleft()
        batch, rows = [first], first.rows
        if not self.max_batch_size:
            return batch
        deadline = time.monotonic() + self.max_queue_delay_s
        while rows < self.max_batch_size:
            if self._pending:
                head = self._pending[0]
                if rows + head.rows > self.max_batch_size or head.batch_key() != first.batch_key():
                    break  # it leads the next batch
                batch.append(self._pending.popleft())
                rows += head.rows
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            arrived.clear()
            # An Event, not a queue get, under the timeout: a cancelled wait loses no request.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), remaining)
        return batch
