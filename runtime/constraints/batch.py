"""The batch bookkeeping both vLLM adapters share: engine slots bound to live token lists.

Each constrained slot remembers the request's output-token list and how many tokens the engine
has consumed from it. Before every fill the new tokens are fed to the engine, stopping at the
first ``-1`` (an async-scheduling placeholder, replaced by the real token before sampling);
a list that got shorter (tokens discarded) resets the state and replays it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from runtime.constraints import _engine
from runtime.constraints.engine import ConstraintEngine, compile_plan
from runtime.constraints.metrics import CounterSync
from runtime.constraints.plan import ConstraintPlan, resolve_constraints
from runtime.constraints.registry import CatalogRegistry
from runtime.constraints.schema import ConstraintConfigError, parse_constraints

__all__ = ["ConstraintBatch", "build_plan"]

logger = logging.getLogger(__name__)

#: Placeholder that vLLM's async scheduling puts in output lists until the token is known.
PLACEHOLDER = -1


def build_plan(
    config: object, registry: CatalogRegistry, vocab_size: int, eos_token_id: int | None
) -> ConstraintPlan:
    """Validate ``config`` (the ``constraints`` extra arg) fully, tokenizer checks included."""
    spec = parse_constraints(config)
    if eos_token_id is None:
        raise ConstraintConfigError(
            "constraints", "the model has no end-of-sequence token to end the output with"
        )
    return resolve_constraints(
        spec,
        catalogs=registry.tokenized,
        encode=registry.encode,
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        token_bytes=registry.token_bytes,
    )


@dataclass
class _Slot:
    output: list[int]
    consumed: int = 0
    waiting: bool = False


class ConstraintBatch:
    """Slots ``0..max_batch-1``; ``start_fill`` / ``finish_fill`` produce the step's bitmask."""

    def __init__(
        self,
        *,
        max_batch: int,
        vocab_size: int,
        registry: CatalogRegistry,
        default_eos_token_id: int | None,
        num_threads: int | None = None,
        pin_memory: bool = False,
    ) -> None:
        self.engine = ConstraintEngine(max_batch, vocab_size, num_threads)
        self.vocab_size = vocab_size
        self.registry = registry
        self.default_eos_token_id = default_eos_token_id
        self.bitmask = torch.zeros((max_batch, self.engine.words), dtype=torch.int32)
        if pin_memory:
            self.bitmask = self.bitmask.pin_memory()
        self._bitmask_np = self.bitmask.numpy()
        self._slots: list[_Slot | None] = [None] * max_batch
        self._ready = np.zeros(max_batch, dtype=np.int32)
        #: Requests whose configuration failed at add time; they may only end (fail closed).
        self.rejected_requests = 0
        self._counters = CounterSync()

    def constrained_rows(self) -> np.ndarray:
        return np.asarray([i for i, s in enumerate(self._slots) if s is not None], np.int32)

    def add(self, slot: int, config: object | None, output: list[int], eos: int | None) -> None:
        """Bind ``slot`` to a request (None config: the slot becomes unconstrained)."""
        if config is None:
            self.remove(slot)
            return
        eos = eos if eos is not None else self.default_eos_token_id
        try:
            plan = build_plan(config, self.registry, self.vocab_size, eos)
            catalog = vocabulary = None
            if plan.item_list is not None:
                catalog = self.registry.get(plan.item_list.catalog.catalog.name).native
                if plan.item_list.matching == "decoded":
                    vocabulary = self.registry.vocabulary()
            constraint = compile_plan(plan, catalog, vocabulary)
        except ValueError as exc:
            # validate_params runs without the tokenizer; what only the tokenizer can reject
            # ends the request instead of crashing the engine loop.
            logger.warning("constraint rejected at batch time, the request will end: %s", exc)
            self.rejected_requests += 1
            constraint = _engine.Constraint.token_machine(
                1, 0, [0], np.zeros((0, 3), np.int32), eos or 0, [], self.vocab_size
            )
        self.engine.add(slot, constraint)
        self._slots[slot] = _Slot(output=output)

    def remove(self, slot: int) -> None:
        if self._slots[slot] is not None:
            self.engine.remove(slot)
            self._slots[slot] = None

    def move(self, source: int, target: int) -> None:
        """``target`` takes over ``source``'s request; ``source`` becomes empty."""
        if self._slots[source] is None:
            self.remove(target)
            return
        self.engine.move(source, target)
        self._slots[target], self._slots[source] = self._slots[source], None

    def swap(self, a: int, b: int) -> None:
        self.engine.swap(a, b)
        self._slots[a], self._slots[b] = self._slots[b], self._slots[a]

    def _sync(self, index: int, slot: _Slot, slots: list[int], tokens: list[int]) -> None:
        """Queue the slot's new known tokens (in order) for one batched advance."""
        output = slot.output
        if len(output) < slot.consumed:
            self.engine.reset(index)
            slot.consumed = 0
        new = output[slot.consumed :]
        if not new:
            slot.waiting = False
            return
        try:
            known = new.index(PLACEHOLDER)
        except ValueError:
            known = len(new)
        if known:
            slots.extend([index] * known)
            tokens.extend(new[:known])
            slot.consumed += known
        slot.waiting = known < len(new)

    def _advance(self, slots: list[int], tokens: list[int]) -> None:
        if tokens:
            self.engine.advance_batch(np.asarray(slots, np.int32), np.asarray(tokens, np.int32))

    def start_fill(self, only: np.ndarray | None = None) -> None:
        """Consume new tokens and start filling the rows whose tokens are all known.

        ``only`` limits the step to these slots (Model Runner V2 keeps idle requests in
        their slots); by default every constrained slot is filled.
        """
        n = 0
        indices = range(len(self._slots)) if only is None else only.tolist()
        slots: list[int] = []
        tokens: list[int] = []
        for index in indices:
            slot = self._slots[index]
            if slot is None:
                continue
            self._sync(index, slot, slots, tokens)
            if not slot.waiting:
                self._ready[n] = index
                n += 1
        self._advance(slots, tokens)
        if n:
            self.engine.fill(self._bitmask_np, self._ready[:n], wait=False)

    def finish_fill(self) -> np.ndarray:
        """Wait for the fill, complete rows that waited on placeholders; return all rows."""
        self.engine.wait()
        late = []
        slots: list[int] = []
        tokens: list[int] = []
        for index, slot in enumerate(self._slots):
            if slot is not None and slot.waiting:
                self._sync(index, slot, slots, tokens)
                late.append(index)
        self._advance(slots, tokens)
        if late:
            self.engine.fill(self._bitmask_np, np.asarray(late, np.int32))
        # Once per step, after this step's fills: two integer reads, no lock.
        self._counters(self)
        return self.constrained_rows()

    @property
    def total_dead_ends(self) -> int:
        return self.engine.total_dead_ends
