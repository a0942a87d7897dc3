"""Convert an ``outlines-core`` regex index into a ``token_machine`` of the constraint language.

``outlines-core`` compiles a regular expression over a tokenizer's vocabulary into a token
automaton (``outlines_core.Index``); the converter renumbers its states from 0 and moves the
end-of-sequence transitions of final states into ``accepting_states``, so the result can be
sent as ``{"version": 1, "token_machine": ...}``. Only needed where ``outlines-core`` is
installed; nothing else in the package imports it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["token_machine_from_index", "token_machine_from_regex"]


def token_machine_from_index(index: Any, eos_token_id: int) -> dict[str, Any]:
    """The ``token_machine`` section equivalent to an ``outlines_core.Index``."""
    initial = index.get_initial_state()
    table: dict[int, dict[int, int]] = index.get_transitions()
    finals = set(index.get_final_states())
    states = [initial, *sorted((set(table) | finals) - {initial})]
    number = {state: k for k, state in enumerate(states)}
    transitions = [
        [number[state], token, number[target]]
        for state in states
        for token, target in sorted(table.get(state, {}).items())
        if token != eos_token_id
    ]
    return {
        "num_states": len(states),
        "initial_state": 0,
        "accepting_states": sorted(number[s] for s in finals),
        "transitions": transitions,
    }


def token_machine_from_regex(
    regex: str, vocabulary: dict[str, list[int]], eos_token_id: int
) -> dict[str, Any]:
    """Build the index with ``outlines-core`` and convert it (token string -> ids vocabulary)."""
    try:
        from outlines_core import Index, Vocabulary
    except ImportError as exc:
        raise ImportError(
            "token_machine_from_regex needs the outlines-core package (pip install outlines-core)"
        ) from exc
    index = Index(regex, Vocabulary(eos_token_id, vocabulary))
    return token_machine_from_index(index, eos_token_id)
