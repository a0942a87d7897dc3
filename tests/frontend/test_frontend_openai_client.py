"""The official openai client (sync, async, streaming) against the frontend over sockets."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from runtime.constraints.catalog import CATALOG_DIR_ENV
from tests.frontend.conftest import Served

MODEL = "toy-llm"


@pytest.fixture
def client(frontend: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_completion_renders_the_template_and_maps_sampling(
    client: openai.OpenAI, frontend: Served
) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello world"}],
        max_tokens=5,
        temperature=0,
    )
    seen = frontend.standin.requests[-1]
    assert seen.text_input == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert seen.sampling_parameters == {"max_tokens": 5, "temperature": 0.0}
    assert seen.flags["exclude_input_in_output"] is True and seen.flags["stream"] is False
    choice = reply.choices[0]
    assert len(choice.message.content.split()) == 5 and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens == len(seen.text_input.split())


def test_default_max_tokens_is_the_rest_of_the_context(
    client: openai.OpenAI, frontend: Served
) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    seen = frontend.standin.requests[-1]
    assert seen.sampling_parameters["max_tokens"] == 256 - len(seen.text_input.split())


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


async def test_async_client_completions_and_stream(frontend: Served) -> None:
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    reply = await client.completions.create(model=MODEL, prompt="the dog", max_tokens=4, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(len(c.text.split()) == 4 for c in reply.choices)
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
    client: openai.OpenAI, frontend: Served
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "who"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
        max_tokens=20,
    )
    sent = json.loads(frontend.standin.requests[-1].sampling_parameters["structured_outputs"])
    assert sent == {"json": schema}
    assert set(json.loads(reply.choices[0].message.content)) == {"name", "age"}


def test_embeddings_float_and_base64(client: openai.OpenAI, frontend: Served) -> None:
    # The client asks for base64 by default and decodes it.
    reply = client.embeddings.create(model=MODEL, input=["the cat", "a dog"])
    assert len(reply.data) == 2 and len(reply.data[0].embedding) == 8
    floats = client.embeddings.create(
        model=MODEL, input="the cat", encoding_format="float", dimensions=4
    )
    assert len(floats.data[0].embedding) == 4
    assert frontend.standin.requests[-1].embedding_request == {
        "input": "the cat",
        "pooling_params": {"dimensions": [4]},
    }
    assert reply.data[0].embedding == pytest.approx(
        client.embeddings.create(model=MODEL, input="the cat", encoding_format="float")
        .data[0]
        .embedding,
        rel=1e-6,
    )


def test_constraints_through_extra_body(client: openai.OpenAI, frontend: Served) -> None:
    spec = {"version": 1, "banned_tokens": [3, 4]}
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_body={"constraints": spec},
    )
    assert frontend.standin.requests[-1].sampling_parameters["extra_args"] == {"constraints": spec}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt="x", extra_body={"constraints": {"version": 2}}
        )
    assert info.value.body["param"] == "constraints.version"


def test_catalog_errors_are_400s_naming_the_field(
    client: openai.OpenAI, frontend: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "films.jsonl").write_text('{"id": "f1", "text": "red sky"}\n')
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    sent = len(frontend.standin.requests)

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
    assert len(frontend.standin.requests) == sent  # refused before reaching Triton
    ask({"catalog": "films", "allow": ["f1"]})
    assert frontend.standin.requests[-1].sampling_parameters["extra_args"]["constraints"][
        "item_list"
    ]["allow"] == ["f1"]


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
