"""The engine-loop benchmark's requests pass the constraint processor's checks: a request that
vLLM refuses stops the benchmark at its first batch (ignore_eos beside constraints once did)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.engine_loop import (
    requests_of,
    sampling_params,
    step_requests,
    throughput_impls,
    write_catalogs,
)
from runtime.constraints.processor import ConstraintLogitsProcessor
from tests.support.tiny_llm import TinyLlm


def test_every_request_of_the_benchmark_is_accepted(
    tiny_llm: TinyLlm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = write_catalogs(tmp_path, tiny_llm)
    monkeypatch.setenv("LLM_SERVING_CATALOG_DIR", str(tmp_path))
    requests = step_requests(8, 8, 32, seed=1) + step_requests(8, 0, 32, seed=2)
    for extra in throughput_impls(texts).values():
        requests += requests_of(4, 4, 64, 0, extra)
    assert any(r.constraints for r in requests) and any(not r.constraints for r in requests)
    for request in requests:
        ConstraintLogitsProcessor.validate_params(sampling_params(request))
