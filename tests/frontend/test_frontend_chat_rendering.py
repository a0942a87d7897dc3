"""What a chat request becomes on its way to the engine, compared with what vLLM's own server
makes of it: the BOS a template writes when the tokenizer adds one too, replayed tool-call
arguments, and special tokens kept for the tool-call parser.

The engine's tokenization is transformers' ``AutoTokenizer`` on the tokenizer files (what vLLM
loads) with special tokens added, as vLLM tokenizes a text prompt; the references for replayed
messages are vLLM's own ``chat_utils``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, processors
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from runtime.frontend.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    cut_after_final_message,
)
from tests.frontend.conftest import (
    LOOKUP_TOOL,
    Served,
    make_settings,
    serve,
    serve_real,
    write_tokenizer,
)
from tests.support.kserve_server import KServeStandIn
from tests.support.real_triton import TritonServer
from tests.support.tiny_llm import BOS as TINY_BOS
from tests.support.tiny_llm import CHAT_TEMPLATE as TINY_TEMPLATE
from tests.support.tiny_llm import TinyLlm

MODEL = "toy-llm"
MAX_MODEL_LEN = 256
# Llama 2 / Mistral style: the template writes the BOS itself.
BOS_TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
HI = [{"role": "user", "content": "hi"}]


def _bos_tokenizer(directory: Path, *, adds_bos: bool) -> Path:
    """A word-level tokenizer whose post-processor adds ``<s>`` (as Llama's and Mistral's
    tokenizer.json do) when ``adds_bos``, with a template that writes ``{{ bos_token }}``."""
    directory.mkdir(parents=True, exist_ok=True)
    words = ["<s>", "</s>", "[UNK]", "[INST]", "[/INST]", "hi", "there"]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    if adds_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 0)]
        )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": BOS_TEMPLATE,
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text("{}")
    return directory


def _engine_ids(directory: Path, text: str) -> list[int]:
    """The token ids vLLM's engine runs on for ``text_input`` (a text prompt)."""
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(str(directory))(text).input_ids)


def _text_input(served: Served) -> str:
    """The prompt text of the last request the frontend sent."""
    text = served.requests[-1].text_input
    assert text is not None
    return text


def _chat(served: Served, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": HI, **fields}
    return httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("adds_bos", [True, False], ids=["tokenizer-adds-bos", "template-only"])
def test_the_engine_sees_one_bos_as_in_vllm_serve(
    standin: KServeStandIn, tmp_path: Path, adds_bos: bool
) -> None:
    directory = _bos_tokenizer(tmp_path / "tok", adds_bos=adds_bos)
    served = serve(make_settings(standin, directory), standin)
    try:
        response = _chat(served, messages=[{"role": "user", "content": "hi there"}])
        assert response.status_code == 200, response.text
        sent, text = served.requests[-1], _text_input(served)
        tokenizer = served.state.tokenizer
    finally:
        served.stop()
    engine = _engine_ids(directory, text)
    assert engine[0] == 0 and engine.count(0) == 1, engine
    # vLLM's own chat route: the full rendered text, without special tokens added.
    rendered = "<s>[INST] hi there [/INST]"
    assert engine == tokenizer.encode(rendered, add_special_tokens=False).ids
    # The frontend's count (the rest of the context is the default budget) is the engine's.
    assert sent.sampling_parameters["max_tokens"] == MAX_MODEL_LEN - len(engine)


def test_real_engine_counts_the_tiny_models_bos_once(
    real_triton: TritonServer, tiny_llm: TinyLlm
) -> None:
    # The tiny model's own template writes its BOS and its tokenizer adds none: the BOS stays.
    served = serve_real(real_triton, tiny_llm.path)
    try:
        response = _chat(served, max_tokens=2)
        assert response.status_code == 200, response.text
        text = _text_input(served)
        ids = served.state.tokenizer.encode(text).ids
    finally:
        served.stop()
    assert TINY_TEMPLATE.startswith("{{ bos_token }}") and text.startswith(TINY_BOS)
    assert ids.count(served.state.tokenizer.token_to_id(TINY_BOS)) == 1
    assert response.json()["usage"]["prompt_tokens"] == len(ids)


NAMED = {"type": "function", "function": {"name": "lookup"}}


@pytest.mark.parametrize(
    ("fields", "skipped"),
    [
        pytest.param({"tools": [LOOKUP_TOOL]}, False, id="auto"),
        pytest.param({"tools": [LOOKUP_TOOL], "tool_choice": "required"}, False, id="required"),
        pytest.param({"tools": [LOOKUP_TOOL], "tool_choice": NAMED}, False, id="named"),
        pytest.param({"tools": [LOOKUP_TOOL], "tool_choice": "none"}, None, id="none"),
        pytest.param({}, None, id="no-tools"),
    ],
)
def test_tool_calls_keep_special_tokens(
    frontend: Served, fields: dict[str, Any], skipped: bool | None
) -> None:
    # Some tokenizers mark <tool_call> special: vLLM would drop it from the text before the
    # parser saw it, so with tools the frontend asks for special tokens, as vLLM's parsers do.
    response = _chat(frontend, max_tokens=90, temperature=0, **fields)
    assert response.status_code == 200, response.text
    assert frontend.requests[-1].sampling_parameters.get("skip_special_tokens") is skipped


def test_real_backend_takes_skip_special_tokens(real_frontend: Served) -> None:
    response = _chat(real_frontend, tools=[LOOKUP_TOOL], max_tokens=4, temperature=0)
    assert response.status_code == 200, response.text
    assert real_frontend.requests[-1].sampling_parameters["skip_special_tokens"] is False


# The assistant-tool-call branch of Llama 3.1's template: `'tool_calls' in message`, and the
# arguments written with tojson (a mapping expected, as transformers documents).
TOOL_TEMPLATE = (
    "{% for m in messages %}{% if 'tool_calls' in m %}"
    "{% if m.tool_calls | length != 1 %}{{ raise_exception('one call at a time') }}{% endif %}"
    "<call>{{ m.tool_calls[0].function.name }} {{ m.tool_calls[0].function.arguments | tojson }}"
    "</call>{% else %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}<assistant>"
)
ARGUMENTS = ['{"city": "Paris"}', "", "null", "[1, 2]", "5", '"x"', "NaN", "not json", '{"a": ']


@pytest.fixture(scope="module")
def tool_frontend(
    standin: KServeStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    directory = write_tokenizer(tmp_path_factory.mktemp("tool-template"), TOOL_TEMPLATE)
    served = serve(make_settings(standin, directory), standin)
    yield served
    served.stop()


def _replayed(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]


def _call(arguments: str) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": arguments}
    return {"id": "call_1", "type": "function", "function": function}


def _vllm_arguments(arguments: str) -> Any:
    """What vLLM's chat_utils hands the template for ``arguments`` (raises where vLLM does)."""
    from vllm.entrypoints.chat_utils import _postprocess_messages

    messages: list[Any] = [{"role": "assistant", "content": "", "tool_calls": [_call(arguments)]}]
    _postprocess_messages(messages)
    return messages[0]["tool_calls"][0]["function"]["arguments"]


@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_replayed_arguments_reach_the_template_as_vllm_parses_them(
    tool_frontend: Served, arguments: str
) -> None:
    response = _chat(tool_frontend, max_tokens=2, messages=_replayed([_call(arguments)]))
    try:
        expected = _vllm_arguments(arguments)
    except ValueError:
        # vLLM's server answers a 400 for it; so does the frontend, naming the field.
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "messages[1].tool_calls[0].function.arguments"
        assert error["param"] in error["message"] and "send" in error["message"]
        return
    assert response.status_code == 200, response.text
    rendered = json.dumps(expected, ensure_ascii=False)
    assert f"<call>get_weather {rendered}</call>" in _text_input(tool_frontend)


def test_an_empty_tool_call_list_takes_the_plain_assistant_path(tool_frontend: Served) -> None:
    # vLLM drops tool_calls=[]; a template testing `'tool_calls' in message` would refuse it.
    response = _chat(tool_frontend, max_tokens=2, messages=_replayed([]))
    assert response.status_code == 200, response.text
    assert "<assistant><tool>18C" in _text_input(tool_frontend)


@pytest.mark.parametrize(
    "template",
    [
        TINY_TEMPLATE,
        # Trims each message, so the text to continue loses its trailing space.
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}",
    ],
)
@pytest.mark.parametrize("final", ["It is ", "  It is", "{"])
def test_continue_final_message_cuts_where_transformers_does(template: str, final: str) -> None:
    from transformers import PreTrainedTokenizerFast

    messages = [*HI, {"role": "assistant", "content": final}]
    reference = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    ).apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    ours = ChatTemplate(template, "", "").render(messages, add_generation_prompt=False)
    assert cut_after_final_message(ours, final) == reference


def test_a_last_message_the_template_does_not_render_cannot_be_continued() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m['role'] }}{% endfor %}", "", "")
    messages = [*HI, {"role": "assistant", "content": "It is"}]
    with pytest.raises(ChatTemplateError, match="does not render the last message"):
        cut_after_final_message(template.render(messages, add_generation_prompt=False), "It is")
