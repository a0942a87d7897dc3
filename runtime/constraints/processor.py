"""vLLM V1-interface logits processor running catalog / state-machine / banned-token constraints.

Registered through the ``vllm.logits_processors`` entry point. A request opts in with
``SamplingParams(extra_args={"constraints": {...}})`` (the language of
:mod:`runtime.constraints.schema`); catalogs come from ``LLM_SERVING_CATALOG_DIR``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import (
    Encoder,
    FileStamp,
    catalog_dir_from_env,
    file_stamp,
    tokenizer_encoder,
)
from runtime.constraints.device_mask import HOST_BITMASKS, DeviceMask
from runtime.constraints.plan import check_catalog_fields
from runtime.constraints.registry import CatalogRegistry
from runtime.constraints.schema import (
    check_sampling_combination,
    parse_constraints,
)
from runtime.constraints.token_bytes import TokenBytes, token_bytes_table

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "EXTRA_ARGS_KEY",
    "ConstraintLogitsProcessor",
    "LazyEncoder",
    "TokenizerLoadError",
    "catalog_registry",
    "load_tokenizer",
    "model_eos_token_id",
]

#: Key of ``SamplingParams.extra_args`` that carries a request's constraint configuration.
EXTRA_ARGS_KEY = "constraints"


class TokenizerLoadError(ValueError):
    """The model's ``tokenizer.json`` is missing or unreadable; constrained requests fail."""


def _tokenizer_file(name_or_path: str) -> Path:
    """The ``tokenizer.json`` that :func:`load_tokenizer` reads for ``name_or_path``."""
    path = Path(name_or_path)
    return path / "tokenizer.json" if path.is_dir() else path


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The model's fast tokenizer from ``tokenizer.json`` in its directory (no downloads)."""
    candidate = _tokenizer_file(name_or_path)
    if not candidate.is_file():
        raise TokenizerLoadError(
            f"constraints need the model's tokenizer.json; none found at {candidate} "
            "(model_config.tokenizer must be a local directory)"
        )
    try:
        return Tokenizer.from_file(str(candidate))
    except Exception as exc:
        # tokenizers raises a plain Exception for a malformed file; as a ValueError it takes
        # the batch's fail-closed path instead of escaping into vLLM's engine loop.
        raise TokenizerLoadError(
            f"the model's tokenizer {candidate} cannot be loaded: {exc} "
            "(replace it with a valid tokenizer.json)"
        ) from exc


class LazyEncoder:
    """Loads the tokenizer on the first constrained request, not at engine start.

    The entry point puts the processor into every vLLM engine of the image, so a model that
    never sees a constraint must start even without a ``tokenizer.json``; a constrained
    request then fails closed with the loading error.
    """

    def __init__(self, name_or_path: str) -> None:
        self._name_or_path = name_or_path
        self._tokenizer: Tokenizer | None = None
        self._encode: Encoder | None = None
        #: The last loading error, under the stamp of the file before that read.
        self._failure: tuple[FileStamp, str] | None = None

    def _loaded(self) -> Tokenizer:
        if self._tokenizer is None:
            # A broken tokenizer.json is parsed once, not at every constrained request (each
            # inside vLLM's engine loop), until the file changes.
            stamp = file_stamp(_tokenizer_file(self._name_or_path))
            if self._failure is not None and self._failure[0] == stamp:
                raise TokenizerLoadError(self._failure[1])
            try:
                self._tokenizer = load_tokenizer(self._name_or_path)
            except TokenizerLoadError as exc:
                self._failure = (stamp, str(exc))
                raise
        return self._tokenizer

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        if self._encode is None:
            self._encode = tokenizer_encoder(self._loaded())
        return self._encode(texts)

    def token_bytes(self, vocab_size: int) -> TokenBytes:
        """The decoded bytes of every token id, from the same tokenizer (decoded matching)."""
        return token_bytes_table(self._loaded(), vocab_size)


def catalog_registry(tokenizer: str, vocab_size: int) -> CatalogRegistry:
    """The process's catalogs, tokenized (and decoded) with the model's tokenizer."""
    encoder = LazyEncoder(tokenizer)
    return CatalogRegistry(
        catalog_dir_from_env(), encoder, vocab_size, lambda: encoder.token_bytes(vocab_size)
    )


def model_eos_token_id(vllm_config: Any) -> int | None:
    """The model's first end-of-sequence id from its Hugging Face config, if any."""
    eos = getattr(getattr(vllm_config.model_config, "hf_config", None), "eos_token_id", None)
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def _config_of(params: SamplingParams) -> object | None:
    return (params.extra_args or {}).get(EXTRA_ARGS_KEY)


class ConstraintLogitsProcessor(LogitsProcessor):
    """Batch-level processor: masks run on the engine's threads between update and apply."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Reject a bad configuration (schema, unknown catalog, unknown item ids, sampling
        parameters that mask the same logits) up front."""
        config = _config_of(sampling_params)
        if config is None:
            return
        check_catalog_fields(parse_constraints(config), catalog_dir_from_env())
        check_sampling_combination(
            min_tokens=sampling_params.min_tokens,
            allowed_token_ids=sampling_params.allowed_token_ids,
            bad_words=sampling_params.bad_words,
            ignore_eos=sampling_params.ignore_eos,
            structured_outputs=getattr(sampling_params, "structured_outputs", None) is not None,
        )

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        model_config = vllm_config.model_config
        vocab_size = model_config.get_vocab_size()
        registry = catalog_registry(model_config.tokenizer, vocab_size)
        on_device = self.masks_on_device(device)
        pin_memory = is_pin_memory and device.type == "cuda"
        self.batch = ConstraintBatch(
            max_batch=vllm_config.scheduler_config.max_num_seqs,
            vocab_size=vocab_size,
            registry=registry,
            default_eos_token_id=model_eos_token_id(vllm_config),
            pin_memory=pin_memory,
            bitmasks=HOST_BITMASKS if on_device else 1,
        )
        self.device = device
        self._device_mask = (
            DeviceMask(self.batch, device, pin_memory=pin_memory) if on_device else None
        )

    @staticmethod
    def masks_on_device(device: torch.device) -> bool:
        """Whether ``apply`` copies the bitmask to ``device`` instead of masking on the host."""
        return device.type != "cpu"

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply removed, added, moved (vLLM's order), then start this step's fill."""
        if batch_update is not None:
            for index in batch_update.removed:
                self.batch.remove(index)
            for index, params, _prompt, output in batch_update.added:
                self.batch.add(
                    index,
                    _config_of(params),
                    output,
                    params.eos_token_id,
                    params.all_stop_token_ids,
                )
            for a, b, direction in batch_update.moved:
                if direction == MoveDirectionality.SWAP:
                    self.batch.swap(a, b)
                else:
                    self.batch.move(a, b)
        if self._device_mask is not None:
            self._device_mask.before_fill()
        self.batch.start_fill()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = self.batch.finish_fill()
        if rows.size == 0:
            return logits
        if self._device_mask is None:
            self.batch.mask(logits, rows)
        else:
            self._device_mask.apply(logits, rows)
        return logits

    @property
    def dead_ends(self) -> int:
        """Steps at which a constraint had nothing left and forced its terminator or EOS."""
        return self.batch.total_dead_ends
