"""The rendered ``model.json`` is what vLLM 0.27.1 (Triton 26.08's) accepts, with our processor.

Triton's vLLM backend builds ``AsyncEngineArgs(**model.json)``: every key must be one of its
fields, and vLLM's own loader (entry points plus the names in model.json) must end up with our
processor exactly once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.sample.logits_processor import _load_custom_logitsprocs

from runtime.constraints.plugin import ConstraintProcessorEntryPoint
from runtime.entrypoint.render import render_repository
from runtime.entrypoint.settings import EntrypointSettings
from runtime.package import build_package
from tests.runtime.wheelmaker import make_source


def test_model_json_keys_are_engine_args_and_the_processor_loads(tmp_path: Path) -> None:
    default = EntrypointSettings.model_fields["logits_processor"].default
    manifest = build_package(make_source(tmp_path / "src"), tmp_path / "v")
    model = render_repository(manifest, tmp_path / "v", tmp_path / "u", tmp_path / "repo", default)
    args = json.loads((model / "1" / "model.json").read_text())

    accepted = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(args) <= accepted, sorted(set(args) - accepted)
    assert "logits_processors" in accepted
    # vLLM's own loader: installed entry points, then the module:Class names of model.json.
    loaded = _load_custom_logitsprocs(args["logits_processors"])
    assert loaded.count(ConstraintProcessorEntryPoint) == 1, loaded
    assert default == "runtime.constraints.plugin:ConstraintProcessorEntryPoint"
    # And AsyncEngineArgs itself takes the rendered file as keyword arguments.
    engine_args = AsyncEngineArgs(**args)
    assert engine_args.logits_processors == args["logits_processors"]
    assert engine_args.disable_log_stats is False
