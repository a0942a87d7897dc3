"""The pure-Python reference: one state machine per request, like vLLM V0 logits processors.

It is the oracle of the engine's property tests and the baseline of the benchmark, so it is
written for clarity: a per-request dict trie of the allowed items with a count of the items
still available below each node.

Semantics shared with the engine (``csrc/``):

- Item list: ``prefix item (separator item)* terminator`` then end of sequence (an empty
  terminator is end of sequence itself). After a complete item the separator is allowed if
  ``max_items`` is not reached and an item is still available; the terminator if ``min_items``
  is reached. When neither is (every allowed item used before ``min_items``), or when no item
  is available at all, the terminator is forced and the step counts as a dead end.
- Token machine: transitions of the current state, plus end of sequence in accepting states;
  a state with neither forces end of sequence (a dead end).
- Banned tokens are removed last; an empty result forces end of sequence (a dead end).
- A token outside the allowed set moves the request to a failed state that allows only end of
  sequence and counts a rejected token. End of sequence ends the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from runtime.constraints.plan import ConstraintPlan, ItemListPlan

__all__ = ["ReferenceConstraint", "words_per_row"]


def words_per_row(vocab_size: int) -> int:
    """int32 words in one bitmask row: ``ceil(vocab_size / 32)``."""
    return (vocab_size + 31) // 32


class _Phase(Enum):
    PREFIX = auto()
    ITEM = auto()
    SEPARATOR = auto()
    TERMINATOR = auto()
    END = auto()
    MACHINE = auto()
    FREE = auto()
    DONE = auto()
    FAILED = auto()


@dataclass
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    item: int | None = None
    available: int = 0


class ReferenceConstraint:
    """One request's constraint state; ``fill_row`` writes its next-token bitmask row."""

    def __init__(self, plan: ConstraintPlan) -> None:
        self.plan = plan
        self.dead_ends = 0
        self.rejected_tokens = 0
        self.reset()

    def reset(self) -> None:
        """Back to the state before the first output token (counters are kept)."""
        plan = self.plan
        self._pos = 0
        self._count = 0
        self._used: set[int] = set()
        if plan.item_list is not None:
            self._root = _build_trie(plan.item_list)
            self._node = self._root
            self._phase = _Phase.PREFIX if plan.item_list.prefix else _Phase.ITEM
        elif plan.machine is not None:
            self._state = plan.machine.initial_state
            self._phase = _Phase.MACHINE
        else:
            self._phase = _Phase.FREE

    @property
    def finished(self) -> bool:
        """True once end of sequence was consumed or a token was rejected."""
        return self._phase in (_Phase.DONE, _Phase.FAILED)

    def _item_available(self, item: int | None) -> bool:
        # The per-request trie holds only allowed items, so a terminal node is an allowed item.
        unique = self.plan.item_list.unique  # type: ignore[union-attr]
        return item is not None and not (unique and item in self._used)

    def _after_item(self) -> tuple[bool, bool, bool]:
        """(item complete here, separator allowed, terminator allowed) at the current node."""
        spec = self.plan.item_list
        assert spec is not None
        complete = self._item_available(self._node.item)
        if not complete:
            return False, False, False
        k = self._count + 1
        remaining = self._root.available - (1 if spec.unique else 0)
        can_sep = (spec.max_items is None or k < spec.max_items) and remaining > 0
        return True, can_sep, k >= spec.min_items

    def _term_first(self) -> int:
        spec = self.plan.item_list
        assert spec is not None
        return spec.terminator[0] if spec.terminator else self.plan.eos_token_id

    def allowed(self) -> tuple[list[int], bool]:
        """Allowed next tokens before banning, and whether they were forced (a dead end)."""
        plan, phase = self.plan, self._phase
        eos = plan.eos_token_id
        if phase in (_Phase.DONE, _Phase.FAILED, _Phase.END):
            return [eos], False
        if phase is _Phase.FREE:
            return list(range(plan.vocab_size)), False
        if phase is _Phase.MACHINE:
            machine = plan.machine
            assert machine is not None
            tokens = list(machine.transitions[self._state])
            if self._state in machine.accepting:
                tokens.append(eos)
            return (tokens, False) if tokens else ([eos], True)
        spec = plan.item_list
        assert spec is not None
        if phase is _Phase.PREFIX:
            return [spec.prefix[self._pos]], False
        if phase is _Phase.SEPARATOR:
            return [spec.separator[self._pos]], False
        if phase is _Phase.TERMINATOR:
            return [spec.terminator[self._pos]], False
        tokens = [t for t, child in self._node.children.items() if child.available > 0]
        _, can_sep, can_term = self._after_item()
        if can_sep:
            tokens.append(spec.separator[0])
        if can_term:
            tokens.append(self._term_first())
        if not tokens:
            return [self._term_first()], True
        return tokens, False

    def fill_row(self, row: np.ndarray) -> None:
        """Write the next-token bitmask into ``row`` (int32, ``words_per_row(V)`` words)."""
        plan = self.plan
        tokens, forced = self.allowed()
        allowed = np.zeros(words_per_row(plan.vocab_size) * 32, dtype=bool)
        allowed[np.asarray(tokens, dtype=np.int64)] = True
        if plan.banned:
            allowed[np.asarray(plan.banned, dtype=np.int64)] = False
            if not allowed.any():
                allowed[plan.eos_token_id] = True
                forced = True
        if forced:
            self.dead_ends += 1
        row[:] = np.packbits(allowed, bitorder="little").view("<i4")

    def advance(self, token: int) -> None:
        """Consume one generated token."""
        tokens, _ = self.allowed()
        if token not in tokens:
            self._phase = _Phase.FAILED
            self.rejected_tokens += 1
            return
        if token == self.plan.eos_token_id:
            self._phase = _Phase.DONE
            return
        phase = self._phase
        if phase is _Phase.FREE:
            return
        if phase is _Phase.MACHINE:
            self._state = self.plan.machine.transitions[self._state][token]  # type: ignore[union-attr]
            return
        spec = self.plan.item_list
        assert spec is not None
        if phase is _Phase.PREFIX:
            self._step_piece(spec.prefix, _Phase.ITEM)
        elif phase is _Phase.SEPARATOR:
            self._step_piece(spec.separator, _Phase.ITEM)
        elif phase is _Phase.TERMINATOR:
            self._step_piece(spec.terminator, _Phase.END)
        else:
            self._advance_item(spec, token)

    def _step_piece(self, piece: tuple[int, ...], then: _Phase) -> None:
        self._pos += 1
        if self._pos == len(piece):
            self._pos = 0
            self._phase = then
            self._node = self._root

    def _advance_item(self, spec: ItemListPlan, token: int) -> None:
        child = self._node.children.get(token)
        if child is not None and child.available > 0:
            self._node = child
            return
        complete, _, _ = self._after_item()
        if complete:
            self._complete(self._node.item)  # type: ignore[arg-type]
        if token == spec.separator[0]:
            self._phase, self._pos = _Phase.SEPARATOR, 1
            if len(spec.separator) == 1:
                self._phase, self._pos, self._node = _Phase.ITEM, 0, self._root
        else:
            self._phase, self._pos = _Phase.TERMINATOR, 1
            if len(spec.terminator) == 1:
                self._phase, self._pos = _Phase.END, 0

    def _complete(self, item: int) -> None:
        self._count += 1
        spec = self.plan.item_list
        assert spec is not None
        if not spec.unique:
            return
        self._used.add(item)
        node = self._root
        node.available -= 1
        for token in spec.catalog.tokens[item]:
            node = node.children[token]
            node.available -= 1


def _build_trie(spec: ItemListPlan) -> _Node:
    root = _Node()
    items = range(len(spec.catalog.tokens)) if spec.allowed is None else spec.allowed
    for item in items:
        node = root
        node.available += 1
        for token in spec.catalog.tokens[item]:
            node = node.children.setdefault(token, _Node())
            node.available += 1
        node.item = item
    return root
