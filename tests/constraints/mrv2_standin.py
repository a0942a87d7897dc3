"""Stand-in for Model Runner V2's request state and logits context (vLLM >= 0.32).

vLLM 0.27.1 (installed here) ships Model Runner V2's ``RequestState`` but not its logits
processor interface, and its state lives in pinned/UVA memory that needs CUDA. This stand-in
keeps the attributes the adapter reads, with the same meaning as
``vllm.v1.worker.gpu.states.RequestState``: ``max_num_reqs``, ``device``,
``all_token_ids.gpu`` (``[max_num_reqs, max_model_len]`` int32), ``prompt_len.np`` and
``total_len.gpu``; indices are handed out from ``free_indices.pop()`` as vLLM does. The
context passed to ``apply`` carries ``idx_mapping_np`` (logits row -> req_idx), as vLLM's
``InputBatch`` does. Never imported by product code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch


class RequestStatesStandIn:
    def __init__(self, max_num_reqs: int, max_model_len: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.device = torch.device("cpu")
        self.free_indices = list(range(max_num_reqs))
        self.req_id_to_index: dict[str, int] = {}
        self.all_token_ids = SimpleNamespace(
            gpu=torch.zeros((max_num_reqs, max_model_len), dtype=torch.int32)
        )
        self.prompt_len = SimpleNamespace(np=np.zeros(max_num_reqs, dtype=np.int32))
        self.total_len = SimpleNamespace(gpu=torch.zeros(max_num_reqs, dtype=torch.int32))

    def add_request(self, req_id: str, prompt: list[int], all_token_ids: list[int]) -> int:
        req_idx = self.free_indices.pop()
        self.req_id_to_index[req_id] = req_idx
        self.prompt_len.np[req_idx] = len(prompt)
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


@dataclass
class LogitsContextStandIn:
    idx_mapping_np: np.ndarray
