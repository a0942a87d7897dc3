"""The serving pod end to end, in real processes on free loopback ports.

A model package (its own tokenizer built in code, a JSONL catalog) is served by
``python -m runtime.entrypoint`` in embedded mode: the ``tritonserver`` stand-in from
``tests/support`` (which records every request it receives) and the real OpenAI frontend
(``python -m runtime.frontend``), driven with the official ``openai`` client; then SIGTERM.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from vllm import SamplingParams

from runtime.constraints.catalog import CATALOG_DIR_ENV, load_catalog
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.schema import ConstraintConfigError
from runtime.serving_backend import BACKEND_NAME
from tests.runtime.pod import Pod
from tests.runtime.wheelmaker import make_source, write_catalog
from tests.support.ports import free_port
from tests.support.toy_model import VOCAB, ToyModel

API_KEY = "sk-end-to-end"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _source(root: Path) -> Path:
    """The shared package source, with a chat tokenizer over the toy model's words."""
    source = make_source(root, serving_mode="embedded")
    tokenizer_dir = source / "tokenizer"
    vocab = {w: i for i, w in enumerate(VOCAB)}
    vocab["[UNK]"] = len(vocab)
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    config = {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>"}
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    write_catalog(source / "catalogs" / "titles.jsonl", {"t1": VOCAB[3], "t2": VOCAB[4]})
    return source


def _recorded(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_embedded_pod_serves_the_openai_client_and_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = Pod.create(tmp_path, source=_source(tmp_path / "src"))
    record = tmp_path / "triton-requests.jsonl"
    keys = tmp_path / "api-keys"
    keys.write_text(hashlib.sha256(API_KEY.encode()).hexdigest() + "\n")
    frontend_port = free_port()
    pod.env.update(
        {
            "LLM_SERVING_TRITONSERVER": f"{sys.executable} -m tests.support.kserve_server",
            "LLM_SERVING_FRONTEND_COMMAND": f"{sys.executable} -m runtime.frontend",
            "LLM_SERVING_FRONTEND_PORT": str(frontend_port),
            # What the serving pod sets for the frontend beyond what the entrypoint passes.
            "LLM_SERVING_FRONTEND_HOST": "127.0.0.1",
            "LLM_SERVING_FRONTEND_API_KEYS_FILE": str(keys),
            "KSERVE_STANDIN_RECORD": str(record),
        }
    )
    pod.start().wait_ready(timeout=120)
    try:
        base_url = f"http://127.0.0.1:{frontend_port}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=30)

        assert [m.id for m in client.models.list().data] == ["toy"]

        chat = client.chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "the fox"}], max_tokens=4
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens > 0

        pieces = [
            chunk.choices[0].text
            for chunk in client.completions.create(
                model="toy", prompt="the fox", max_tokens=4, stream=True
            )
            if chunk.choices
        ]
        assert "".join(pieces)

        schema = {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        }
        structured = client.chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": "who"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
            max_tokens=20,
        )
        assert set(json.loads(structured.choices[0].message.content or "")) == {"name"}

        constraints = {"version": 1, "item_list": {"catalog": "titles", "allow": ["t1"]}}
        client.completions.create(
            model="toy", prompt="pick", max_tokens=4, extra_body={"constraints": constraints}
        )
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(
                model="toy", prompt="pick", extra_body={"constraints": {"version": 2}}
            )
        assert bad.value.body["param"] == "constraints.version"  # type: ignore[index]

        # Scoring: the entrypoint rendered the serving image's backend, whose model declares
        # prompt_logprobs, so /v1/score answers instead of 501.
        score = httpx.post(
            f"{base_url}/score",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"model": "toy", "prompt": "the cat", "candidates": [" sat on", " ran"]},
            timeout=30,
        )
        assert score.status_code == 200, score.text
        toy = ToyModel()
        for item in score.json()["data"]:
            rows = toy.prompt_logprobs("the cat" + item["candidate"])[2:]
            expected = sum(v for r in rows if r is not None for v in r.values())
            assert item["logprob"] == pytest.approx(expected)
    finally:
        code, err = pod.terminate()
    assert code == 0, err
    assert "drained: every in-flight request finished" in err

    config = (tmp_path / "work" / "model_repository" / "toy" / "config.pbtxt").read_text()
    assert f'backend: "{BACKEND_NAME}"' in config
    # What reached "Triton": each request's tensors, as the vLLM backend takes them.
    seen = _recorded(record)
    scoring, seen = seen[4:], seen[:4]  # the prompt's length, then one prefill per candidate
    prefills = [r for r in scoring if "prompt_logprobs" in r["requested_outputs"]]
    assert len(scoring) == 3 and len(prefills) == 2
    assert all(r["sampling_parameters"]["prompt_logprobs"] == 0 for r in prefills)
    assert {r["rpc"] for r in seen} == {"ModelStreamInfer"}
    assert json.loads(seen[2]["sampling_parameters"]["structured_outputs"]) == {"json": schema}
    assert seen[1]["flags"]["stream"] is True
    sent = seen[-1]["sampling_parameters"]["extra_args"]["constraints"]
    assert sent["item_list"]["catalog"] == "titles" and sent["item_list"]["allow"] == ["t1"]
    assert len(seen) == 4  # the refused constraint never reached the backend (nor is scored)
    # The constraint processor in Triton's vLLM accepts it against the catalog folder the
    # entrypoint prepared, and refuses an item that is not in that catalog.
    catalogs = tmp_path / "work" / "catalogs"
    assert load_catalog(catalogs, "titles").ids == ("t1", "t2")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(catalogs))
    ConstraintLogitsProcessor.validate_params(
        SamplingParams(extra_args=seen[-1]["sampling_parameters"]["extra_args"])
    )
    sent["item_list"]["allow"] = ["t9"]
    with pytest.raises(ConstraintConfigError, match="t9"):
        ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args={"constraints": sent}))
