"""Python face of the native engine: compiles plans and checks arrays before each native call."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.constraints import _engine
from runtime.constraints.catalog import TokenizedCatalog
from runtime.constraints.plan import ConstraintPlan
from runtime.constraints.threads import default_num_threads
from runtime.constraints.token_bytes import TokenBytes

__all__ = [
    "ConstraintEngine",
    "EngineConfigError",
    "EngineStateError",
    "compile_byte_catalog",
    "compile_catalog",
    "compile_plan",
    "compile_vocabulary",
]

EngineConfigError = _engine.EngineConfigError
EngineStateError = _engine.EngineStateError


def compile_catalog(tokenized: TokenizedCatalog, vocab_size: int) -> _engine.Catalog:
    """Compile a tokenized catalog into the engine's immutable trie."""
    lengths = np.fromiter((len(t) for t in tokenized.tokens), dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter(
        (t for seq in tokenized.tokens for t in seq), dtype=np.int32, count=int(offsets[-1])
    )
    return _engine.Catalog(tokens, offsets, vocab_size)


def compile_byte_catalog(tokenized: TokenizedCatalog) -> _engine.Catalog:
    """Compile a catalog's items as UTF-8 bytes (decoded matching) into the engine's trie."""
    texts = [t.encode("utf-8") for t in tokenized.catalog.texts]
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=offsets[1:])
    data = np.frombuffer(b"".join(texts), dtype=np.uint8).astype(np.int32)
    return _engine.Catalog(data, offsets, 256)


def compile_vocabulary(table: TokenBytes) -> _engine.Vocabulary:
    """Compile the vocabulary's token bytes (None: no bytes) into the engine's byte trie."""
    pieces = [b or b"" for b in table]
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)), out=offsets[1:])
    return _engine.Vocabulary(np.frombuffer(b"".join(pieces), dtype=np.uint8), offsets)


def compile_plan(
    plan: ConstraintPlan,
    catalog: _engine.Catalog | None,
    vocabulary: _engine.Vocabulary | None = None,
) -> _engine.Constraint:
    """Build the engine's constraint for ``plan``; ``catalog`` is needed for item lists (its
    byte trie in decoded matching, which also needs the compiled ``vocabulary``)."""
    banned = list(plan.banned)
    if plan.item_list is not None:
        spec = plan.item_list
        if catalog is None:
            raise ValueError("an item-list plan needs its compiled catalog")
        allowed = None if spec.allowed is None else np.asarray(spec.allowed, dtype=np.int32)
        # Both matchings take the same arguments after their delimiters (tokens or bytes).
        rules = (
            spec.min_items,
            spec.max_items,
            spec.unique,
            allowed,
            plan.eos_token_id,
            banned,
            plan.vocab_size,
        )
        if spec.matching == "decoded":
            if vocabulary is None:
                raise ValueError("a decoded item-list plan needs the compiled vocabulary")
            return _engine.Constraint.decoded_item_list(
                catalog,
                vocabulary,
                spec.prefix_bytes,
                spec.separator_bytes,
                spec.terminator_bytes,
                *rules,
            )
        return _engine.Constraint.item_list(
            catalog, list(spec.prefix), list(spec.separator), list(spec.terminator), *rules
        )
    if plan.machine is not None:
        m = plan.machine
        return _engine.Constraint.token_machine(
            m.num_states,
            m.initial_state,
            sorted(m.accepting),
            m.transitions,
            plan.eos_token_id,
            banned,
            plan.vocab_size,
        )
    return _engine.Constraint.banned(plan.eos_token_id, banned, plan.vocab_size)


def _as_int32(array: Any, name: str) -> np.ndarray:
    if hasattr(array, "numpy"):  # a torch tensor: share its memory, never copy
        if array.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got {array.device}")
        array = array.numpy()
    array = np.asarray(array)
    if array.dtype != np.int32:
        raise ValueError(f"{name} must be int32, got {array.dtype}")
    return array


class ConstraintEngine:
    """Slots ``0..max_batch-1`` of request constraints and the batched bitmask fill.

    Safe to share between threads: the native engine runs one call at a time, and each call
    first waits for a pending fill, whichever thread started it.
    """

    def __init__(self, max_batch: int, vocab_size: int, num_threads: int | None = None) -> None:
        threads = default_num_threads() if num_threads is None else num_threads
        self._native = _engine.Engine(max_batch, vocab_size, threads)

    @property
    def native(self) -> _engine.Engine:
        return self._native

    @property
    def max_batch(self) -> int:
        return self._native.max_batch

    @property
    def words(self) -> int:
        return self._native.words

    @property
    def num_threads(self) -> int:
        return self._native.num_threads

    def add(self, slot: int, constraint: _engine.Constraint) -> None:
        self._native.add(slot, constraint)

    def remove(self, slot: int) -> None:
        self._native.remove(slot)

    def move(self, source: int, target: int) -> None:
        self._native.move(source, target)

    def swap(self, a: int, b: int) -> None:
        self._native.swap(a, b)

    def reset(self, slot: int) -> None:
        self._native.reset(slot)

    def advance(self, slot: int, tokens: list[int]) -> None:
        self._native.advance(slot, tokens)

    def advance_batch(self, slots: Any, tokens: Any) -> None:
        """Advance ``slots[i]`` by ``tokens[i]`` for every i, in order (int32 arrays)."""
        self._native.advance_batch(
            np.ascontiguousarray(_as_int32(slots, "slots")),
            np.ascontiguousarray(_as_int32(tokens, "tokens")),
        )

    def step(
        self,
        outputs: list[list[int] | None],
        rows: np.ndarray,
        consumed: np.ndarray,
        order: np.ndarray,
        bitmask: np.ndarray,
        *,
        fill_waiting: bool = False,
        wait: bool = True,
    ) -> int:
        """Bring each slot of ``rows`` (int32) up to its output-token list and fill its row.

        ``consumed[row]`` (int64, >= 0, updated) counts the tokens of ``outputs[row]`` the slot
        has taken: a list now shorter resets the slot and replays it, new tokens are advanced up
        to the first placeholder (-1). Rows stopped at a placeholder are filled only with
        ``fill_waiting``. Writes the rows whose tokens are all known, then the others, into
        ``order`` (int32, at least as long as ``rows``) and returns how many are ready. The
        lists are read at once; with ``wait=False`` the engine's threads do the rest, keeping
        ``bitmask`` (int32 ``[n, words]``) referenced until :meth:`wait`. A refused call
        (:class:`EngineConfigError` naming the row, or :class:`EngineStateError`) changes
        neither ``consumed`` nor ``order`` nor any slot.
        """
        return self._native.step(outputs, rows, consumed, order, bitmask, fill_waiting, wait)

    def mask_logits(self, logits: Any, bitmask: Any, rows: Any) -> None:
        """Set ``logits[r, j]`` to -inf for every r in ``rows`` (int32, strictly increasing)
        where bit j of ``bitmask[r]`` is 0, in place; rows past the logits are skipped.

        ``logits``: a C-contiguous float32 ``[n, <= words * 32]`` tensor or array on the CPU.
        """
        if isinstance(logits, np.ndarray):
            if logits.dtype != np.float32:
                raise ValueError(f"logits must be float32, got {logits.dtype}")
            if not logits.flags.c_contiguous or not logits.flags.writeable:
                raise ValueError("logits must be a writable C-contiguous array")
            address = logits.ctypes.data
        else:
            if logits.device.type != "cpu" or not logits.is_contiguous():
                raise ValueError(f"logits must be contiguous on the CPU, got {logits.device}")
            # torch's only 4-byte floating dtype is float32 (checked without importing torch).
            if not logits.dtype.is_floating_point or logits.element_size() != 4:
                raise ValueError(f"logits must be float32, got {logits.dtype}")
            address = logits.data_ptr()
        if logits.ndim != 2:
            raise ValueError(f"logits must have 2 dimensions, got {logits.ndim}")
        n, columns = logits.shape
        self._native.mask_logits(
            address, n, columns, _as_int32(bitmask, "bitmask"), _as_int32(rows, "rows")
        )

    def active(self, slot: int) -> bool:
        return self._native.active(slot)

    def fill(self, bitmask: Any, rows: Any, *, wait: bool = True) -> None:
        """Write the rows' bitmasks into ``bitmask`` (int32 ``[n, words]``, CPU).

        With ``wait=False`` the fill runs on the engine's threads, which keep ``bitmask``
        referenced until :meth:`wait`; call it before reading ``bitmask``.
        """
        mask = _as_int32(bitmask, "bitmask")
        self._native.fill(mask, np.ascontiguousarray(_as_int32(rows, "rows")), wait)

    def wait(self) -> None:
        self._native.wait()

    def slot_info(self, slot: int) -> dict[str, Any]:
        return self._native.slot_info(slot)

    @property
    def total_dead_ends(self) -> int:
        return self._native.total_dead_ends
