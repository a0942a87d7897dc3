"""The batch bookkeeping both vLLM adapters share: engine slots bound to live token lists.

Each constrained slot remembers the request's output-token list and how many tokens the engine
has consumed from it. Before every fill the new tokens are fed to the engine, stopping at the
first ``-1`` (an async-scheduling placeholder, replaced by the real token before sampling);
a list that got shorter (tokens discarded) resets the state and replays it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch

from runtime.constraints import _engine
from runtime.constraints.engine import ConstraintEngine, compile_plan
from runtime.constraints.masking import apply_bitmask_inplace
from runtime.constraints.metrics import CounterSync
from runtime.constraints.plan import ConstraintPlan, resolve_constraints
from runtime.constraints.registry import CatalogRegistry
from runtime.constraints.schema import ConstraintConfigError, parse_constraints

__all__ = ["ConstraintBatch", "build_plan"]

logger = logging.getLogger(__name__)

_NO_ROWS = np.zeros(0, dtype=np.int32)


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


class ConstraintBatch:
    """Slots ``0..max_batch-1``; ``start_fill`` / ``finish_fill`` produce the step's bitmask.

    A step costs no per-row Python: ``start_fill`` makes one native call over the constrained
    slots (a sorted array rebuilt only when they change), which reads the new tokens from the
    lists and leaves advancing and filling to the engine's threads; ``finish_fill`` waits.
    """

    def __init__(
        self,
        *,
        max_batch: int,
        vocab_size: int,
        registry: CatalogRegistry,
        default_eos_token_id: int | None,
        num_threads: int | None = None,
        pin_memory: bool = False,
        bitmasks: int = 1,
    ) -> None:
        if bitmasks < 1:
            raise ValueError(f"bitmasks must be at least 1, got {bitmasks}")
        self.engine = ConstraintEngine(max_batch, vocab_size, num_threads)
        self.vocab_size = vocab_size
        self.registry = registry
        self.default_eos_token_id = default_eos_token_id
        self._bitmasks: list[torch.Tensor] = []
        for _ in range(bitmasks):
            buffer = torch.zeros((max_batch, self.engine.words), dtype=torch.int32)
            self._bitmasks.append(buffer.pin_memory() if pin_memory else buffer)
        self._bitmask_nps = [buffer.numpy() for buffer in self._bitmasks]
        #: Index of the buffer this step fills (``rotate_bitmask`` moves it on).
        self.bitmask_index = 0
        self.bitmask = self._bitmasks[0]
        self._bitmask_np = self._bitmask_nps[0]
        #: Each slot's live output-token list (None: unconstrained) and how many of its tokens
        #: the engine has consumed; both move with the slot.
        self._outputs: list[list[int] | None] = [None] * max_batch
        self._consumed = np.zeros(max_batch, dtype=np.int64)
        self._constrained = np.zeros(max_batch, dtype=bool)
        self._rows: np.ndarray | None = _NO_ROWS
        #: The native sync's output: rows ready to fill, then rows stopped at a placeholder.
        self._order = np.zeros(max_batch, dtype=np.int32)
        #: Rows of the current step whose fill waits for their placeholders to be replaced.
        self._late = _NO_ROWS
        #: Whether this step's fill is pending (or rows still wait on placeholders).
        self._stepping = False
        #: Requests whose configuration failed at add time; they may only end (fail closed).
        self.rejected_requests = 0
        self._counters = CounterSync()

    def constrained_rows(self) -> np.ndarray:
        """The constrained slots, ascending (int32; shared, do not modify)."""
        if self._rows is None:
            self._rows = np.flatnonzero(self._constrained).astype(np.int32)
        return self._rows

    def _bind(self, slot: int, output: list[int] | None, consumed: int = 0) -> None:
        self._outputs[slot] = output
        self._consumed[slot] = consumed
        if self._constrained[slot] != (output is not None):
            self._constrained[slot] = output is not None
            self._rows = None

    def add(
        self,
        slot: int,
        config: object | None,
        output: list[int],
        eos: int | None,
        stop_token_ids: Iterable[int] = (),
    ) -> None:
        """Bind ``slot`` to a request (None config: the slot becomes unconstrained).

        ``eos`` is the request's end-of-sequence id (None: the model's); ``stop_token_ids``
        (vLLM's ``all_stop_token_ids``) are the other ids that end it, which a request whose
        configuration fails here may end with when the EOS is not in the vocabulary.
        """
        if config is None:
            self.remove(slot)
            return
        eos = eos if eos is not None else self.default_eos_token_id
        try:
            constraint = self._compile(config, eos)
        except Exception as exc:
            # update_state runs for the whole batch inside vLLM's engine loop: anything raised
            # here would end every request, so this one ends instead (fails closed). A
            # ValueError is a configuration only the tokenizer can reject (validate_params runs
            # without it); anything else is a bug, logged with its traceback.
            self.rejected_requests += 1
            if isinstance(exc, ValueError):
                logger.warning("constraint rejected at batch time, the request will end: %s", exc)
            else:
                logger.exception("constraint failed at batch time, the request will end")
            fallback = self._end_now(slot, eos, stop_token_ids)
            if fallback is None:
                return
            constraint = fallback
        self.engine.add(slot, constraint)
        self._bind(slot, output)

    def _compile(self, config: object, eos: int | None) -> _engine.Constraint:
        plan = build_plan(config, self.registry, self.vocab_size, eos)
        catalog = vocabulary = None
        if plan.item_list is not None:
            catalog = self.registry.get(plan.item_list.catalog.catalog.name).native
            if plan.item_list.matching == "decoded":
                vocabulary = self.registry.vocabulary()
        return compile_plan(plan, catalog, vocabulary)

    def _end_now(
        self, slot: int, eos: int | None, stop_token_ids: Iterable[int]
    ) -> _engine.Constraint | None:
        """A constraint that allows only a token ending the request: its EOS, else the model's,
        else its lowest stop token inside the vocabulary (token 0 when none is).

        None (the slot left unconstrained) only if even that cannot be built: an exception
        here would end the whole batch.
        """
        try:
            ends = [eos, self.default_eos_token_id, *sorted(stop_token_ids)]
            valid = [t for t in ends if t is not None and 0 <= t < self.vocab_size]
            if valid:
                end = valid[0]
            else:
                # Nothing can end it early: it runs to max_tokens or a stop string, as any
                # request of this model would. One fixed token keeps it failing closed (the
                # model's own text could break the constraint unnoticed; a repeated token is
                # taken for no answer), and an all -inf row would leave the sampler NaNs.
                end = 0
                logger.error(
                    "the rejected request cannot end at once: none of its end tokens %s is "
                    "inside the vocabulary of %d; it runs to max_tokens emitting token 0",
                    [t for t in ends if t is not None],
                    self.vocab_size,
                )
            return _engine.Constraint.token_machine(
                1, 0, [0], np.zeros((0, 3), np.int32), end, [], self.vocab_size
            )
        except Exception:
            logger.exception("cannot build the constraint that ends the rejected request")
            self.remove(slot)
            return None

    def remove(self, slot: int) -> None:
        if self._outputs[slot] is not None:
            self.engine.remove(slot)
            self._bind(slot, None)

    def move(self, source: int, target: int) -> None:
        """``target`` takes over ``source``'s request; ``source`` becomes empty."""
        output = self._outputs[source]
        if output is None:
            self.remove(target)
            return
        self.engine.move(source, target)
        consumed = int(self._consumed[source])
        self._bind(source, None)
        self._bind(target, output, consumed)

    def swap(self, a: int, b: int) -> None:
        self.engine.swap(a, b)
        output_a, consumed_a = self._outputs[a], int(self._consumed[a])
        self._bind(a, self._outputs[b], int(self._consumed[b]))
        self._bind(b, output_a, consumed_a)

    @property
    def bitmask_count(self) -> int:
        """How many host bitmask buffers the batch alternates between."""
        return len(self._bitmasks)

    def rotate_bitmask(self) -> int:
        """Make the next buffer the one this step fills (cyclically); its index.

        With two buffers a step fills one while the device may still be copying the other;
        every constrained row is rewritten at each step, so no buffer carries state forward.
        """
        self.bitmask_index = (self.bitmask_index + 1) % len(self._bitmasks)
        self.bitmask = self._bitmasks[self.bitmask_index]
        self._bitmask_np = self._bitmask_nps[self.bitmask_index]
        return self.bitmask_index

    def start_fill(self, only: np.ndarray | None = None) -> None:
        """Consume new tokens and start filling the rows whose tokens are all known.

        ``only`` limits the step to these slots (Model Runner V2 keeps idle requests in
        their slots); by default every constrained slot is filled.
        """
        if only is None:
            rows = self.constrained_rows()
        else:
            only = np.asarray(only, dtype=np.int32)
            rows = only[self._constrained[only]]
        if rows.size == 0:
            self._late = _NO_ROWS
            return
        ready = self.engine.step(
            self._outputs, rows, self._consumed, self._order, self._bitmask_np, wait=False
        )
        self._late = self._waiting(ready, rows.size)
        self._stepping = True

    def _waiting(self, ready: int, count: int) -> np.ndarray:
        """The rows a step left at a placeholder (``order`` is overwritten by the next step)."""
        return _NO_ROWS if ready == count else self._order[ready:count].copy()

    def finish_fill(self) -> np.ndarray:
        """Wait for the fill, complete rows that waited on placeholders; return all rows."""
        if not self._stepping:
            return self.constrained_rows()
        late = self._late
        if late.size:
            ready = self.engine.step(
                self._outputs,
                late,
                self._consumed,
                self._order,
                self._bitmask_np,
                fill_waiting=True,
            )
            self._late = self._waiting(ready, late.size)
        # Once per step with constrained rows: the counters change only in fills and when a
        # request is added (a rejected request is constrained too). Like the step above, reading
        # the dead ends waits for the pending step first, which is all the wait this needs.
        self._counters(self)
        self._stepping = bool(self._late.size)
        return self.constrained_rows()

    def mask(self, logits: torch.Tensor, rows: np.ndarray) -> None:
        """Set ``logits[r, j]`` (CPU) to -inf where bit j of this step's ``bitmask[r]`` is 0.

        ``rows`` ascending; rows past the logits are skipped.
        """
        if (
            logits.dtype is torch.float32
            and logits.is_cpu
            and logits.is_contiguous()
            and not logits.requires_grad
        ):
            # Checked here, so the tensor's address goes to the engine as is: no index tensor,
            # no unpacked mask, no copy, not even a numpy view (microseconds at every step).
            n, columns = logits.shape
            self.engine.native.mask_logits(logits.data_ptr(), n, columns, self._bitmask_np, rows)
        else:
            rows = rows[: np.searchsorted(rows, logits.shape[0])]
            apply_bitmask_inplace(logits, self.bitmask, torch.from_numpy(rows).to(torch.int64))

    @property
    def total_dead_ends(self) -> int:
        return self.engine.total_dead_ends
