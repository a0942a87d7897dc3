"""
Native constraint engine of llm-serving.
"""

from __future__ import annotations

import collections.abc
import typing

import numpy
import typing_extensions

# numpy's stubs declare ndarray's buffer protocol for Python 3.12+ only.
_Buffer: typing_extensions.TypeAlias = typing_extensions.Buffer | numpy.ndarray

class EngineConfigError(ValueError):
    pass

class EngineStateError(RuntimeError):
    pass

class Catalog:
    """
    An immutable compiled catalog trie.
    """
    def __init__(
        self,
        tokens: _Buffer,
        offsets: _Buffer,
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def num_items(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

class Vocabulary:
    """
    The decoded bytes of every token, compiled into a byte trie.
    """
    def __init__(self, bytes: _Buffer, offsets: _Buffer) -> None: ...
    @property
    def max_token_length(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

class Constraint:
    """
    One request's compiled constraint.
    """
    @staticmethod
    def banned(
        eos_token_id: typing.SupportsInt | typing.SupportsIndex,
        banned: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> Constraint: ...
    @staticmethod
    def decoded_item_list(
        catalog: Catalog,
        vocabulary: Vocabulary,
        prefix: bytes,
        separator: bytes,
        terminator: bytes,
        min_items: typing.SupportsInt | typing.SupportsIndex,
        max_items: typing.SupportsInt | typing.SupportsIndex | None,
        unique: bool,
        allowed: _Buffer | None,
        eos_token_id: typing.SupportsInt | typing.SupportsIndex,
        banned: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> Constraint: ...
    @staticmethod
    def item_list(
        catalog: Catalog,
        prefix: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        separator: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        terminator: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        min_items: typing.SupportsInt | typing.SupportsIndex,
        max_items: typing.SupportsInt | typing.SupportsIndex | None,
        unique: bool,
        allowed: _Buffer | None,
        eos_token_id: typing.SupportsInt | typing.SupportsIndex,
        banned: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> Constraint: ...
    @staticmethod
    def token_machine(
        num_states: typing.SupportsInt | typing.SupportsIndex,
        initial_state: typing.SupportsInt | typing.SupportsIndex,
        accepting: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        transitions: _Buffer,
        eos_token_id: typing.SupportsInt | typing.SupportsIndex,
        banned: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
    ) -> Constraint: ...

class Engine:
    """
    Request slots and the batched bitmask fill.
    """
    def __init__(
        self,
        max_batch: typing.SupportsInt | typing.SupportsIndex,
        vocab_size: typing.SupportsInt | typing.SupportsIndex,
        num_threads: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def active(self, slot: typing.SupportsInt | typing.SupportsIndex) -> bool: ...
    def add(
        self, slot: typing.SupportsInt | typing.SupportsIndex, constraint: Constraint
    ) -> None: ...
    def advance(
        self,
        slot: typing.SupportsInt | typing.SupportsIndex,
        tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
    ) -> None: ...
    def advance_batch(self, slots: _Buffer, tokens: _Buffer) -> None: ...
    def fill(self, bitmask: _Buffer, rows: _Buffer, wait: bool = True) -> None: ...
    def mask_logits(
        self,
        logits: typing.SupportsInt | typing.SupportsIndex,
        num_rows: typing.SupportsInt | typing.SupportsIndex,
        columns: typing.SupportsInt | typing.SupportsIndex,
        bitmask: _Buffer,
        rows: _Buffer,
    ) -> None: ...
    def move(
        self,
        source: typing.SupportsInt | typing.SupportsIndex,
        target: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def remove(self, slot: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def reset(self, slot: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def slot_info(
        self, slot: typing.SupportsInt | typing.SupportsIndex
    ) -> dict[str, typing.Any]: ...
    def step(
        self,
        outputs: list,
        rows: _Buffer,
        consumed: _Buffer,
        order: _Buffer,
        bitmask: _Buffer,
        fill_waiting: bool,
        wait: bool,
    ) -> int: ...
    def swap(
        self,
        a: typing.SupportsInt | typing.SupportsIndex,
        b: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def wait(self) -> None: ...
    @property
    def max_batch(self) -> int: ...
    @property
    def num_threads(self) -> int: ...
    @property
    def total_dead_ends(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def words(self) -> int: ...

def default_num_threads() -> int:
    """
    Worker threads the engine uses: LLM_SERVING_ENGINE_THREADS, else the core count.
    """

def transition_rows(rows: object) -> numpy.ndarray | None:
    """
    Rows of three ints (lists or tuples) as an int64 array (n, 3); None when one is not.
    """

THREADS_ENV_VAR: str = "LLM_SERVING_ENGINE_THREADS"
__version__: str = "0.1.0"
