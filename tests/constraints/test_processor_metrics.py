"""The processor's dead-end and rejected-request counters, in prometheus_client's multiprocess
files (as the metrics proxy reads them), written by a separate process like vLLM's engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.constraints.metrics import DEAD_ENDS_TOTAL, REJECTED_REQUESTS_TOTAL

ROOT = Path(__file__).resolve().parents[2]
# An engine process: one request rejected when it joins the batch (a banned token outside the
# vocabulary passes validate_params), one that bans every token (a dead end: EOS is forced
# at each of its steps), three decoding steps.
ENGINE = """
import sys
from pathlib import Path

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate

from runtime.constraints.processor import ConstraintLogitsProcessor
from tests.constraints.conftest import vllm_config

VOCAB = 40
config = vllm_config(Path(sys.argv[1]), VOCAB, 4)
proc = ConstraintLogitsProcessor(config, torch.device("cpu"), False)
rejected = SamplingParams(extra_args={"constraints": {"version": 1, "banned_tokens": [400]}})
dead_end = SamplingParams(
    extra_args={"constraints": {"version": 1, "banned_tokens": list(range(VOCAB))}}
)
outputs = [[], []]
added = [(0, rejected, [1], outputs[0]), (1, dead_end, [1], outputs[1])]
proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[], added=added))
for step in range(3):
    if step:
        proc.update_state(None)
    proc.apply(torch.zeros((2, VOCAB)))
    outputs[0].append(0)
    outputs[1].append(0)
print("totals", proc.dead_ends, proc.batch.rejected_requests)
"""


def _values(folder: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    return {
        sample.name: sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("llm_serving_constraint_")
    }


# Importing torch and vLLM in the child takes 15 s on an idle machine and over 75 s on a loaded
# 2-core one; the limits only guard against a hang.
@pytest.mark.timeout(600)
def test_counters_reach_the_multiprocess_folder(tmp_path: Path) -> None:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # vLLM logs on stdout too: the totals are on the last line.
    label, *totals = done.stdout.strip().splitlines()[-1].split()
    assert label == "totals", done.stdout
    dead_ends, rejected = (int(v) for v in totals)
    assert dead_ends >= 1 and rejected == 1
    assert _values(multiproc) == {DEAD_ENDS_TOTAL: dead_ends, REJECTED_REQUESTS_TOTAL: 1}
