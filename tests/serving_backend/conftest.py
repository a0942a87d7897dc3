"""Our Triton backend, imported over the stand-ins of Triton's Python stub and the stock
vLLM backend (``tests/support/triton_python_stub``, ``tests/support/stock_vllm_backend``)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from runtime.serving_backend import STOCK_BACKEND_DIR_ENV

SUPPORT = Path(__file__).resolve().parents[1] / "support"
STUB_DIR = SUPPORT / "triton_python_stub"
STOCK_DIR = SUPPORT / "stock_vllm_backend"


@pytest.fixture(scope="session")
def backend() -> Iterator[ModuleType]:
    """``runtime.serving_backend.model`` (the file Triton loads), as Triton's stub would
    import it: the stub's utils importable, the stock backend found through the environment."""
    saved = os.environ.get(STOCK_BACKEND_DIR_ENV)
    os.environ[STOCK_BACKEND_DIR_ENV] = str(STOCK_DIR)
    sys.path.insert(0, str(STUB_DIR))
    try:
        yield importlib.import_module("runtime.serving_backend.model")
    finally:
        if saved is None:
            os.environ.pop(STOCK_BACKEND_DIR_ENV, None)
        else:
            os.environ[STOCK_BACKEND_DIR_ENV] = saved


@pytest.fixture(scope="session")
def pb_utils(backend: ModuleType) -> ModuleType:
    return importlib.import_module("triton_python_backend_utils")
