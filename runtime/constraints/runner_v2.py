"""Model Runner V2 adapter (vLLM >= 0.32) over the same engine and batch bookkeeping.

Model Runner V2 keeps each request at a stable ``req_idx`` and its tokens in a device tensor
(``req_states.all_token_ids``, ``[max_num_reqs, max_model_len]``, with ``prompt_len`` and
``total_len`` per request); processors get ``add_request``, ``apply_staged_writes`` and
``apply(logits, ctx)``, where ``ctx.idx_mapping_np[row]`` is the ``req_idx`` of logits row
``row``. Engine slots are ``req_idx`` values, so there are no moves; a request added again at
the same ``req_idx`` (a new request, or a resumed preemption) replaces the old state.

vLLM's V2 loader accepts only subclasses of its ``LogitsProcessor``, so the class derives from
it wherever vLLM ships it; older vLLM has no such interface and the class stands alone there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.masking import apply_bitmask_inplace
from runtime.constraints.processor import (
    EXTRA_ARGS_KEY,
    ConstraintLogitsProcessor,
    catalog_registry,
    model_eos_token_id,
)

try:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as RunnerV2Processor
except ImportError:  # vLLM < 0.32: no Model Runner V2 processor interface to derive from
    RunnerV2Processor = object  # type: ignore[assignment,misc,unused-ignore]

__all__ = ["ConstraintLogitsProcessorV2", "RunnerV2Processor"]


class ConstraintLogitsProcessorV2(RunnerV2Processor):  # type: ignore[misc,valid-type,unused-ignore]
    """The constraint processor for Model Runner V2's logits-processor interface."""

    validate_params = ConstraintLogitsProcessor.validate_params

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        if getattr(vllm_config, "speculative_config", None) is not None:
            # Draft rows would need the state advanced by each draft token; refuse rather than
            # mask them with the committed state only.
            raise ValueError(
                "the llm-serving constraint processor does not support speculative decoding: "
                "remove speculative_config from the engine arguments of a model that serves "
                "constrained requests"
            )
        model_config = vllm_config.model_config
        vocab_size = model_config.get_vocab_size()
        registry = catalog_registry(model_config.tokenizer, vocab_size)
        self.req_states = req_states
        self.batch = ConstraintBatch(
            max_batch=req_states.max_num_reqs,
            vocab_size=vocab_size,
            registry=registry,
            default_eos_token_id=model_eos_token_id(vllm_config),
        )
        self._staged: list[tuple[int, Any]] = []
        # Output tokens copied from the device so far, per req_idx (the batch reads these).
        self._outputs: list[list[int] | None] = [None] * req_states.max_num_reqs

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Stage a request (effective at the next ``apply_staged_writes``); True if constrained."""
        self._staged.append((req_idx, sampling_params))
        return (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY) is not None

    def apply_staged_writes(self) -> None:
        for req_idx, params in self._staged:
            config = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
            output: list[int] = []
            self._outputs[req_idx] = output if config is not None else None
            self.batch.add(req_idx, config, output, params.eos_token_id, params.all_stop_token_ids)
        self._staged.clear()

    def _read_tokens(self, req_idxs: np.ndarray) -> None:
        """Bring each request's output list in line with the device token history."""
        states = self.req_states
        prompt = states.prompt_len.np[req_idxs].astype(np.int64)
        total = states.total_len.gpu[torch.from_numpy(req_idxs)].cpu().numpy().astype(np.int64)
        wanted: list[tuple[int, int]] = []
        for k, req_idx in enumerate(req_idxs):
            output = self._outputs[req_idx]
            assert output is not None
            have = len(output)
            n = int(total[k] - prompt[k])
            if n < have:
                del output[n:]  # tokens were discarded: the batch resets and replays
                have = n
            wanted.extend((int(req_idx), int(prompt[k]) + p) for p in range(have, n))
        if not wanted:
            return
        rows = torch.tensor([r for r, _ in wanted], dtype=torch.int64)
        cols = torch.tensor([c for _, c in wanted], dtype=torch.int64)
        tokens = states.all_token_ids.gpu[rows.to(states.device), cols.to(states.device)]
        for (req_idx, _), token in zip(wanted, tokens.cpu().tolist(), strict=True):
            self._outputs[req_idx].append(token)  # type: ignore[union-attr]

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Mask the rows of constrained requests in place and return ``logits``."""
        idx_mapping = np.asarray(ctx.idx_mapping_np, dtype=np.int64)
        if logits.shape[0] != idx_mapping.shape[0]:
            raise RuntimeError(
                f"{logits.shape[0]} logits rows for {idx_mapping.shape[0]} requests: the "
                "constraint processor needs one row per request (no speculative decoding)"
            )
        constrained = [i for i, r in enumerate(idx_mapping) if self._outputs[r] is not None]
        if not constrained:
            return logits
        rows = np.asarray(constrained, dtype=np.int64)
        req_idxs = idx_mapping[rows]
        self._read_tokens(req_idxs)
        self.batch.start_fill(only=req_idxs.astype(np.int32))
        self.batch.finish_fill()
        gathered = self.batch.bitmask[torch.from_numpy(req_idxs)]
        full = torch.zeros((logits.shape[0], gathered.shape[1]), dtype=torch.int32)
        full[torch.from_numpy(rows)] = gathered
        index = torch.from_numpy(rows).to(logits.device)
        apply_bitmask_inplace(logits, full.to(logits.device, non_blocking=True), index)
        return logits
