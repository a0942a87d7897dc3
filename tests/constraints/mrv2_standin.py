"""Stand-in for Model Runner V2's request state (vLLM >= 0.32), and its logits context.

vLLM's ``RequestState`` keeps its buffers in pinned/UVA memory, which needs CUDA. This stand-in
has the fields ``LogitsProcRequestState.from_request_state`` copies, with vLLM 0.33's meaning:
``max_num_reqs``, ``vocab_size``, ``device``, ``all_token_ids.gpu`` (``[max_num_reqs,
max_model_len]`` int32), ``prompt_len.np``, ``prefill_len.np`` and ``total_len.gpu``; indices are
handed out from ``free_indices.pop()`` as vLLM does. :func:`logits_context` builds vLLM's real
``LogitsContext`` where the installed vLLM has one (``.venv-vllm-next``), else a dataclass with
the same fields. Never imported by product code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

try:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
except ImportError:  # vLLM < 0.32

    @dataclass(frozen=True)
    class LogitsContext:  # type: ignore[no-redef]
        expanded_idx_mapping: torch.Tensor
        idx_mapping: torch.Tensor
        idx_mapping_np: np.ndarray
        expanded_local_pos: torch.Tensor
        input_ids: torch.Tensor
        pos: torch.Tensor
        seq_lens_upper_bound_np: np.ndarray


class RequestStatesStandIn:
    def __init__(self, max_num_reqs: int, max_model_len: int, vocab_size: int = 0) -> None:
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")
        self.free_indices = list(range(max_num_reqs))
        self.req_id_to_index: dict[str, int] = {}
        self.all_token_ids = SimpleNamespace(
            gpu=torch.zeros((max_num_reqs, max_model_len), dtype=torch.int32)
        )
        self.prompt_len = SimpleNamespace(np=np.zeros(max_num_reqs, dtype=np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(max_num_reqs, dtype=np.int32))
        self.total_len = SimpleNamespace(gpu=torch.zeros(max_num_reqs, dtype=torch.int32))

    def add_request(self, req_id: str, prompt: list[int], all_token_ids: list[int]) -> int:
        req_idx = self.free_indices.pop()
        self.req_id_to_index[req_id] = req_idx
        self.prompt_len.np[req_idx] = len(prompt)
        self.prefill_len.np[req_idx] = len(all_token_ids)
        self.all_token_ids.gpu[req_idx, : len(all_token_ids)] = torch.tensor(all_token_ids)
        self.total_len.gpu[req_idx] = len(all_token_ids)
        return req_idx

    def append(self, req_idx: int, token: int) -> None:
        end = int(self.total_len.gpu[req_idx])
        self.all_token_ids.gpu[req_idx, end] = token
        self.total_len.gpu[req_idx] = end + 1

    def truncate(self, req_idx: int, tokens: int) -> None:
        self.total_len.gpu[req_idx] -= tokens

    def remove_request(self, req_id: str) -> int:
        req_idx = self.req_id_to_index.pop(req_id)
        self.free_indices.append(req_idx)
        return req_idx


def logits_context(idx_mapping_np: np.ndarray, states: RequestStatesStandIn) -> LogitsContext:
    """This step's context for one logits row per request, in ``idx_mapping_np``'s order."""
    idx = torch.from_numpy(idx_mapping_np)
    total = states.total_len.gpu[idx]
    rows = len(idx_mapping_np)
    return LogitsContext(
        expanded_idx_mapping=idx,
        idx_mapping=idx,
        idx_mapping_np=idx_mapping_np,
        expanded_local_pos=torch.zeros(rows, dtype=torch.int32),
        input_ids=states.all_token_ids.gpu[idx, (total - 1).clamp(min=0)].to(torch.int64),
        pos=(total - 1).to(torch.int64),
        seq_lens_upper_bound_np=total.numpy().copy(),
    )
