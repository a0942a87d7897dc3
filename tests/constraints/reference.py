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
- Decoded matching (a catalog in ``decoded`` mode): the same item list over bytes. A token is
  allowed when its whole byte string can be consumed, one byte at a time, from the current
  position (it may end inside an item or straddle items, separators and the terminator); items
  it completes count for ``unique`` and ``max_items``. After a complete item a byte that
  continues an item continues it (plans refuse separators and terminators whose first byte
  could), otherwise the separator's or terminator's first byte ends the item. Tokens without
  bytes (special tokens) are never allowed; end of sequence is allowed after the terminator
  (or after an item that may end the list when the terminator is empty). When no token is
  allowed, end of sequence is forced and the step counts as a dead end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from functools import lru_cache

import numpy as np

from runtime.constraints.plan import ConstraintPlan, ItemListPlan
from runtime.constraints.token_bytes import TokenBytes

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
        #: The machine's transitions per state: token -> next state.
        self._table: list[dict[int, int]] = []
        if plan.machine is not None:
            self._table = [{} for _ in range(plan.machine.num_states)]
            for state, token, target in plan.machine.transitions.tolist():
                self._table[state][token] = target
        self.dead_ends = 0
        self.rejected_tokens = 0
        self.reset()

    def reset(self) -> None:
        """Back to the state before the first output token (counters are kept)."""
        plan = self.plan
        self._pos = 0
        self._count = 0
        self._used: set[int] = set()
        if plan.item_list is not None and plan.item_list.matching == "decoded":
            self._decoded = _DecodedList(plan.item_list)
            self._phase = _Phase.ITEM
        elif plan.item_list is not None:
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

    @property
    def _is_decoded(self) -> bool:
        return self.plan.item_list is not None and self.plan.item_list.matching == "decoded"

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
        if self._is_decoded:
            tokens = self._decoded.allowed(eos)
            return (tokens, False) if tokens else ([eos], True)
        if phase is _Phase.MACHINE:
            machine = plan.machine
            assert machine is not None
            tokens = list(self._table[self._state])
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
        if self._is_decoded and self._phase is _Phase.ITEM:
            self._advance_decoded(token)
            return
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
            self._state = self._table[self._state][token]
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

    def _advance_decoded(self, token: int) -> None:
        decoded, eos = self._decoded, self.plan.eos_token_id
        if token == eos:
            # End of sequence where the list may end, or where nothing else is allowed.
            if decoded.end_allowed(decoded.cursor) or not decoded.allowed(eos):
                self._phase = _Phase.DONE
                return
        elif 0 <= token < self.plan.vocab_size and decoded.commit(token, eos):
            return
        self._phase = _Phase.FAILED
        self.rejected_tokens += 1

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


class _Where(Enum):
    PREFIX = auto()
    ITEM = auto()
    SEPARATOR = auto()
    TERMINATOR = auto()
    END = auto()


@dataclass(frozen=True)
class _Cursor:
    """A position in the byte language; ``done`` holds the items completed since the last commit."""

    where: _Where
    pos: int
    node: _Node
    count: int
    done: tuple[int, ...] = ()


_VocabNode = dict[int, tuple[list[int], "_VocabNode"]]


@lru_cache(maxsize=4)
def _vocabulary_trie(table: TokenBytes) -> _VocabNode:
    """Token ids by their bytes: ``node[byte] = (tokens spelled exactly here, children)``."""
    root: _VocabNode = {}
    for token, data in enumerate(table):
        node, ids = root, None
        for byte in data or b"":
            ids, node = node.setdefault(byte, ([], {}))
        if ids is not None:
            ids.append(token)
    return root


class _DecodedList:
    """The byte-level item list: a dict trie over item bytes and a cursor moved byte by byte."""

    def __init__(self, spec: ItemListPlan) -> None:
        self.spec = spec
        assert spec.token_bytes is not None
        self.table = spec.token_bytes
        self.texts = [t.encode("utf-8") for t in spec.catalog.catalog.texts]
        self.used: set[int] = set()
        self.root = _Node()
        items = range(len(self.texts)) if spec.allowed is None else spec.allowed
        for item in items:
            node = self.root
            node.available += 1
            for byte in self.texts[item]:
                node = node.children.setdefault(byte, _Node())
                node.available += 1
            node.item = item
        # Bytes spelled so far by each node, to tell which completed items lie below it.
        self.spelled: dict[int, bytes] = {id(self.root): b""}
        stack = [self.root]
        while stack:
            node = stack.pop()
            for byte, child in node.children.items():
                self.spelled[id(child)] = self.spelled[id(node)] + bytes([byte])
                stack.append(child)
        where = _Where.PREFIX if spec.prefix_bytes else _Where.ITEM
        self.cursor = _Cursor(where, 0, self.root, 0)

    def _available_below(self, node: _Node, cursor: _Cursor) -> int:
        if not self.spec.unique:
            return node.available
        prefix = self.spelled[id(node)]
        return node.available - sum(1 for i in cursor.done if self.texts[i].startswith(prefix))

    def _after_item(self, cursor: _Cursor) -> tuple[bool, bool, bool]:
        """(item complete here, separator allowed, terminator allowed), as in canonical mode."""
        spec, item = self.spec, cursor.node.item
        if item is None or (spec.unique and (item in self.used or item in cursor.done)):
            return False, False, False
        k = cursor.count + 1
        remaining = self._available_below(self.root, cursor) - (1 if spec.unique else 0)
        can_sep = (spec.max_items is None or k < spec.max_items) and remaining > 0
        return True, can_sep, k >= spec.min_items

    def step(self, cursor: _Cursor, byte: int) -> _Cursor | None:
        """The cursor after one more byte, or None when the byte leaves the language."""
        spec, where = self.spec, cursor.where
        pieces = {
            _Where.PREFIX: (spec.prefix_bytes, _Where.ITEM),
            _Where.SEPARATOR: (spec.separator_bytes, _Where.ITEM),
            _Where.TERMINATOR: (spec.terminator_bytes, _Where.END),
        }
        if where in pieces:
            piece, then = pieces[where]
            if piece[cursor.pos] != byte:
                return None
            if cursor.pos + 1 < len(piece):
                return _Cursor(where, cursor.pos + 1, cursor.node, cursor.count, cursor.done)
            return _Cursor(then, 0, self.root, cursor.count, cursor.done)
        if where is _Where.END:
            return None
        child = cursor.node.children.get(byte)
        if child is not None and self._available_below(child, cursor) > 0:
            return _Cursor(where, 0, child, cursor.count, cursor.done)
        complete, can_sep, can_term = self._after_item(cursor)
        done = (*cursor.done, cursor.node.item) if complete else cursor.done
        if can_sep and byte == spec.separator_bytes[0]:
            moved = _Cursor(_Where.SEPARATOR, 0, self.root, cursor.count + 1, done)  # type: ignore[arg-type]
            return self.step(moved, byte)
        if can_term and spec.terminator_bytes and byte == spec.terminator_bytes[0]:
            moved = _Cursor(_Where.TERMINATOR, 0, self.root, cursor.count + 1, done)  # type: ignore[arg-type]
            return self.step(moved, byte)
        return None

    def consume(self, data: bytes | None) -> _Cursor | None:
        """The cursor after all of ``data``; None when a byte fails or there are no bytes."""
        if not data:
            return None
        cursor: _Cursor | None = self.cursor
        for byte in data:
            cursor = self.step(cursor, byte)  # type: ignore[arg-type]
            if cursor is None:
                return None
        return cursor

    def end_allowed(self, cursor: _Cursor) -> bool:
        if cursor.where is _Where.END:
            return True
        if cursor.where is not _Where.ITEM or self.spec.terminator_bytes:
            return False
        return self._after_item(cursor)[2]

    def allowed(self, eos: int) -> list[int]:
        """Every token whose bytes the current position accepts, plus EOS where it may end.

        The same as ``consume`` on each token, walked over a trie of the tokens' bytes so that
        a refused byte prunes every token that starts with it.
        """
        tokens: list[int] = []
        stack = [(self.cursor, _vocabulary_trie(self.table))]
        while stack:
            cursor, node = stack.pop()
            for byte, (ids, children) in node.items():
                after = self.step(cursor, byte)
                if after is not None:
                    tokens.extend(t for t in ids if t != eos)
                    stack.append((after, children))
        tokens.sort()
        if self.end_allowed(self.cursor):
            tokens.append(eos)
        return tokens

    def commit(self, token: int, eos: int) -> bool:
        """Consume ``token``'s bytes for good; False (nothing changes) when it is not allowed."""
        cursor = None if token == eos else self.consume(self.table[token])
        if cursor is None:
            return False
        for item in cursor.done:
            if self.spec.unique:
                self.used.add(item)
                node = self.root
                node.available -= 1
                for byte in self.texts[item]:
                    node = node.children[byte]
                    node.available -= 1
        self.cursor = _Cursor(cursor.where, cursor.pos, cursor.node, cursor.count)
        return True
