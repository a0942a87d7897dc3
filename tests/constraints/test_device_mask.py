"""The processor's accelerator path (double-buffered host bitmask, non-blocking copies, masking
where the logits are) with the CPU standing in for the device: the host path's logits at every
step with constrained and free requests mixed, and no call that would wait for a device."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xgrammar
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.device_mask import DeviceMask
from runtime.constraints.masking import apply_bitmask_inplace
from runtime.constraints.processor import ConstraintLogitsProcessor
from tests.constraints.conftest import DevicePathOnHost, vllm_config

VOCAB = 40
MAX_BATCH = 6
CONFIGS: list[dict[str, Any] | None] = [
    {"version": 1, "item_list": {"catalog": "films", "separator": ";", "terminator": "]"}},
    None,
    {"version": 1, "banned_tokens": [2, 3, 5, 7, 11]},
    None,
    {"version": 1, "item_list": {"catalog": "films", "separator": ";", "unique": True}},
]


Check = Callable[[int, torch.Tensor, torch.Tensor], None]


def _run(toy_dir: Path, steps: int, check: Check) -> None:
    """Both paths over one history: requests join, one leaves and another takes its slot."""
    cpu = torch.device("cpu")
    host = ConstraintLogitsProcessor(vllm_config(toy_dir, VOCAB, MAX_BATCH), cpu, False)
    device = DevicePathOnHost(vllm_config(toy_dir, VOCAB, MAX_BATCH), cpu, False)
    rng = random.Random(7)
    outputs: list[list[int]] = []
    builders = (BatchUpdateBuilder(), BatchUpdateBuilder())
    for config in CONFIGS:
        outputs.append([])
        for builder in builders:
            params = SamplingParams(extra_args={"constraints": config} if config else None)
            builder.added.append((len(outputs) - 1, params, [1, 2], outputs[-1]))
    for step in range(steps):
        if step == steps // 2:
            # The free request in slot 1 ends; a constrained one takes the slot.
            outputs[1] = []
            for builder in builders:
                builder.removed_append(1)
                params = SamplingParams(extra_args={"constraints": CONFIGS[2]})
                builder.added.append((1, params, [1], outputs[1]))
        host.update_state(builders[0].get_and_reset(len(outputs)))
        device.update_state(builders[1].get_and_reset(len(outputs)))
        logits = torch.randn((len(outputs), VOCAB), generator=torch.Generator().manual_seed(step))
        masked_host, masked_device = host.apply(logits.clone()), device.apply(logits.clone())
        check(step, masked_host, masked_device)
        for row, output in enumerate(outputs):
            finite = torch.isfinite(masked_host[row]).nonzero().flatten().tolist()
            output.append(rng.choice(finite))


def test_the_device_path_masks_what_the_host_path_masks(toy_dir: Path) -> None:
    seen_free = []

    def check(step: int, host: torch.Tensor, device: torch.Tensor) -> None:
        torch.testing.assert_close(device, host, rtol=0, atol=0, msg=f"step {step}")
        seen_free.append(torch.isfinite(host[3]).all().item())

    _run(toy_dir, 12, check)
    # The free request's row stayed whole: the device path masked only the constrained rows.
    assert all(seen_free)


def test_each_step_fills_the_buffer_the_last_copy_did_not_read(toy_dir: Path) -> None:
    cpu = torch.device("cpu")
    processor = DevicePathOnHost(vllm_config(toy_dir, VOCAB, MAX_BATCH), cpu, False)
    assert processor.batch.bitmask_count == 2
    filled = []
    for _ in range(4):
        processor.update_state(None)
        filled.append(processor.batch.bitmask_index)
        processor.apply(torch.zeros((1, VOCAB)))
    assert filled == [1, 0, 1, 0]


def test_a_single_host_bitmask_is_refused_for_a_device(toy_dir: Path) -> None:
    processor = ConstraintLogitsProcessor(
        vllm_config(toy_dir, VOCAB, MAX_BATCH), torch.device("cpu"), False
    )
    with pytest.raises(ValueError, match="needs 2 host bitmasks, it has 1"):
        DeviceMask(processor.batch, torch.device("cpu"), pin_memory=False)
    with pytest.raises(ValueError, match="bitmasks must be at least 1"):
        ConstraintBatch(
            max_batch=1,
            vocab_size=VOCAB,
            registry=processor.batch.registry,
            default_eos_token_id=0,
            bitmasks=0,
        )


def test_nothing_on_the_device_path_waits_for_the_device(
    toy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a device tensor on the host (``tolist``, ``item``, ``cpu``, truth values) and
    blocking copies each wait for the device; every step runs with them made to fail."""
    copies: list[bool] = []

    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"Tensor.{name} waits for the device")

        return call

    def spy(name: str) -> Callable[..., Any]:
        original = getattr(torch.Tensor, name)

        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            copies.append(bool(kwargs.get("non_blocking", False)))
            return original(self, *args, **kwargs)

        return call

    checked = []

    def check(step: int, host: torch.Tensor, device: torch.Tensor) -> None:
        checked.append(step)

    processor_apply = DevicePathOnHost.apply
    processor_update = DevicePathOnHost.update_state

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any) -> Any:
            with monkeypatch.context() as patch:
                for name in ("tolist", "item", "cpu", "__bool__"):
                    patch.setattr(torch.Tensor, name, refuse(name))
                for name in ("to", "copy_"):
                    patch.setattr(torch.Tensor, name, spy(name))
                return method(self, *args)

        return call

    monkeypatch.setattr(DevicePathOnHost, "apply", guarded(processor_apply))
    monkeypatch.setattr(DevicePathOnHost, "update_state", guarded(processor_update))
    _run(toy_dir, 6, check)
    assert checked == list(range(6))
    assert copies and all(copies), copies


class _LooksLikeCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


@pytest.mark.parametrize("rows", [None, torch.tensor([0, 2])])
def test_xgrammar_gets_the_rows_as_a_device_tensor(
    rows: torch.Tensor | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of rows would be read back from the device; vLLM passes xgrammar a tensor too."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        xgrammar,
        "apply_token_bitmask_inplace",
        lambda logits, bitmask, **kwargs: calls.append({"bitmask": bitmask, **kwargs}),
    )
    logits = torch.zeros((3, VOCAB)).as_subclass(_LooksLikeCuda)
    bitmask = torch.from_numpy(np.zeros((MAX_BATCH, 2), dtype=np.int32))
    apply_bitmask_inplace(logits, bitmask, rows)
    assert len(calls) == 1
    assert calls[0]["indices"] is rows
    assert calls[0]["vocab_size"] == VOCAB
    assert calls[0]["bitmask"].shape == (3, 2)
