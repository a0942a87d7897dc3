"""An outlines-core regex index, converted to a token machine, masks like outlines-core itself."""

from __future__ import annotations

import random

import numpy as np
import pytest
from outlines_core import Index, Vocabulary

from runtime.constraints.engine import ConstraintEngine, compile_plan
from runtime.constraints.outlines import token_machine_from_index, token_machine_from_regex
from runtime.constraints.plan import resolve_constraints
from runtime.constraints.schema import parse_constraints

VOCAB = {"red": [2], "green": [3], "sky": [4], "sea": [5], "x": [6], "re": [7], "d": [8]}
EOS = 0
V = 40


@pytest.mark.parametrize("regex", ["(red|green)(sky|sea)+", "x(re|d)*sky", "(red|re)d?x"])
def test_converted_machine_masks_like_outlines(regex: str) -> None:
    index = Index(regex, Vocabulary(EOS, VOCAB))
    machine = token_machine_from_index(index, EOS)
    assert machine == token_machine_from_regex(regex, VOCAB, EOS)
    plan = resolve_constraints(
        parse_constraints({"version": 1, "token_machine": machine}),
        catalogs=lambda name: None,  # type: ignore[arg-type,return-value]
        encode=lambda texts: [],
        vocab_size=V,
        eos_token_id=EOS,
    )
    engine = ConstraintEngine(1, V, 1)
    rng = random.Random(0)
    mask = np.zeros((1, engine.words), np.int32)
    for _ in range(20):
        engine.add(0, compile_plan(plan, None))
        state = index.get_initial_state()
        while True:
            engine.fill(mask, np.asarray([0], np.int32))
            bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits).tolist()
            assert allowed == sorted(index.get_allowed_tokens(state))
            token = rng.choice(allowed)
            engine.advance(0, [token])
            if token == EOS:
                assert index.is_final_state(state)
                break
            state = index.get_next_state(state, token)
    assert engine.total_dead_ends == 0
