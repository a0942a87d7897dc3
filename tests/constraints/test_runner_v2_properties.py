"""The Model Runner V2 adapter against the reference, driven through the V2 stand-in: stable
req_idx slots, staged adds, preemption (removed and re-added with its tokens), discarded
tokens, rows in a random order each step."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from vllm import SamplingParams

from runtime.constraints.runner_v2 import ConstraintLogitsProcessorV2
from tests.constraints.conftest import vllm_config
from tests.constraints.mrv2_standin import RequestStatesStandIn, logits_context
from tests.constraints.reference import ReferenceConstraint
from tests.constraints.test_processor_properties import (
    EOS,
    ITEM_WORDS,
    PUNCT,
    catalogs,
    constraint_configs,
)
from tests.constraints.toy import catalog_model, word_tokenizer

MAX_REQS = 6
PROMPT = [3, 4]


def _run(
    items: list[tuple[str, str]],
    configs: list[dict | None],
    seed: int,
    vocab: int,
    tokenizer: Tokenizer | None = None,
    matching: str = "canonical",
) -> None:
    """Drive the V2 adapter through a random history; ``matching`` is the catalog's mode."""
    rng = random.Random(seed)
    if tokenizer is None:
        tokenizer = word_tokenizer(ITEM_WORDS + PUNCT)
    with catalog_model(items, tokenizer, vocab, EOS, matching) as (root, plan_of):
        states = RequestStatesStandIn(MAX_REQS, 256, vocab)
        proc = ConstraintLogitsProcessorV2(vllm_config(root, vocab, MAX_REQS), states)
        refs: dict[str, ReferenceConstraint | None] = {}
        outputs: dict[str, list[int]] = {}
        waiting = [f"r{k}" for k in range(len(configs))]
        running: list[str] = []
        for step in range(30):
            for rid in list(running):
                if rng.random() < 0.08 or (refs[rid] is not None and refs[rid].finished):
                    running.remove(rid)
                    states.remove_request(rid)
                    if rng.random() < 0.5 and not (refs[rid] and refs[rid].finished):
                        waiting.insert(0, rid)  # preempted: resumes with its tokens
            while waiting and states.free_indices and rng.random() < 0.7:
                rid = waiting.pop(0)
                config = configs[int(rid[1:])]
                output = outputs.setdefault(rid, [])
                idx = states.add_request(rid, PROMPT, PROMPT + output)
                params = SamplingParams(extra_args={"constraints": config} if config else None)
                assert proc.add_request(idx, params) is (config is not None)
                ref = None
                if config is not None:
                    plan = plan_of(config)
                    ref = ReferenceConstraint(plan)
                    for token in output:
                        ref.advance(token)
                refs[rid] = ref
                running.append(rid)
            proc.apply_staged_writes()
            for rid in running:
                ref = refs[rid]
                if ref is not None and len(outputs[rid]) > 2 and rng.random() < 0.05:
                    del outputs[rid][-2:]
                    states.truncate(states.req_id_to_index[rid], 2)
                    fresh = ReferenceConstraint(ref.plan)
                    fresh.dead_ends = ref.dead_ends
                    for token in outputs[rid]:
                        fresh.advance(token)
                    refs[rid] = fresh
            order = rng.sample(running, len(running))
            ctx = logits_context(
                np.asarray([states.req_id_to_index[r] for r in order], dtype=np.int64), states
            )
            logits = torch.zeros((len(order), vocab))
            proc.apply(logits, ctx)
            for row, rid in enumerate(order):
                where = f"step {step}, row {row}, request {rid}"
                allowed = torch.isfinite(logits[row]).nonzero().flatten().tolist()
                ref = refs[rid]
                if ref is None:
                    assert len(allowed) == vocab, where
                    token = rng.randrange(vocab)
                else:
                    expected = np.zeros((vocab + 31) // 32, dtype=np.int32)
                    ref.fill_row(expected)
                    bits = np.unpackbits(expected.view(np.uint8), bitorder="little")
                    assert allowed == np.flatnonzero(bits[:vocab]).tolist(), where
                    if ref.finished:
                        continue
                    token = rng.choice(allowed)
                    ref.advance(token)
                outputs[rid].append(token)
                states.append(states.req_id_to_index[rid], token)


@settings(
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_runner_v2_matches_reference(data: Any, seed: int) -> None:
    items = data.draw(catalogs())
    vocab = 2 + len(ITEM_WORDS) + len(PUNCT) + 3
    configs = data.draw(
        st.lists(st.none() | constraint_configs(items, vocab), min_size=1, max_size=8)
    )
    _run(items, configs, seed, vocab)
