"""A tiny random Llama and a byte-level BPE tokenizer, built on disk for the real vLLM engine.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on Python's own standard
library sources (text that is on every machine and rich in the punctuation JSON needs), and
the model is a two-layer ``LlamaForCausalLM`` with seeded random weights saved as safetensors.
The folder is what ``vllm.LLM(model=...)`` and the serving image's model packages expect:
``config.json``, ``generation_config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json`` with a chat template.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["BOS", "CHAT_TEMPLATE", "EOS", "TinyLlm", "build_tiny_llm", "tiny_llm_in"]

EOS = "<|eos|>"
BOS = "<|bos|>"
#: Role markers the chat template writes; special tokens, so the model never splits them.
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 1024
#: Standard-library modules whose sources train the tokenizer (stable for a Python release).
_CORPUS_MODULES = ("json/encoder.py", "json/decoder.py", "textwrap.py", "string.py", "csv.py")
#: Bump when the recipe changes, so a cached folder from an older recipe is rebuilt.
_RECIPE = 1


@dataclass(frozen=True)
class TinyLlm:
    """A built model folder and the facts tests need about it."""

    path: Path
    vocab_size: int
    eos_token_id: int
    max_model_len: int = 2048

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.path / "tokenizer.json"))


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in _CORPUS_MODULES]


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS, BOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def build_tiny_llm(dest: Path, *, seed: int = 0) -> TinyLlm:
    """Write the tokenizer and a seeded random two-layer Llama into ``dest`` (a few seconds)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.save(str(dest / "tokenizer.json"))
    eos_id = tokenizer.token_to_id(EOS)
    bos_id = tokenizer.token_to_id(BOS)
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": EOS,
                "model_max_length": 2048,
                "chat_template": CHAT_TEMPLATE,
                "clean_up_tokenization_spaces": False,
            },
            indent=1,
        )
    )
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.do_sample = True
    model.save_pretrained(str(dest), safe_serialization=True)
    return TinyLlm(path=dest, vocab_size=config.vocab_size, eos_token_id=eos_id)


def tiny_llm_in(cache_root: Path) -> TinyLlm:
    """The tiny model under ``cache_root``, built once per recipe and Python release.

    A ``.complete`` marker written last makes a folder half-written by a killed build count as
    absent; concurrent builders each write their own folder and rename it into place.
    """
    key = hashlib.sha256(f"{_RECIPE}:{sysconfig.get_paths()['stdlib']}".encode()).hexdigest()
    folder = cache_root / f"tiny-llama-{key[:12]}"
    marker = folder / ".complete"
    if not marker.exists():
        staging = cache_root / f".{folder.name}.{os.getpid()}"
        built = build_tiny_llm(staging)
        (staging / ".complete").write_text(json.dumps({"vocab_size": built.vocab_size}))
        try:
            staging.rename(folder)
        except OSError:  # another process won the race; its folder is complete
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return TinyLlm(
        path=folder, vocab_size=tokenizer.get_vocab_size(), eos_token_id=tokenizer.token_to_id(EOS)
    )
