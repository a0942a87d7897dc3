"""Find and import NVIDIA's stock vLLM backend, and check the hook this package overrides.

The stock backend is a Python-based backend like ours: Triton would import its ``model.py``
as the top-level module ``model`` with its folder on ``sys.path`` (for its ``utils``
package). Ours is already ``model`` in that process, so the stock file is loaded under a
private module name instead, its folder appended to ``sys.path`` exactly as Triton appends it.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType

from runtime.serving_backend import (
    DEFAULT_STOCK_BACKEND_DIR,
    RESPONSE_HOOK,
    STOCK_BACKEND_DIR_ENV,
)

__all__ = ["HOOK_PARAMETERS", "StockBackendMismatch", "check_response_hook", "load_stock_backend"]

#: The private name the stock ``model.py`` is imported under.
MODULE_NAME = "_llm_serving_stock_vllm_model"
#: ``GenerateRequest.create_response``'s parameters in the stock backend (Triton 25.12 to 26.08):
#: the stock ``_infer`` passes them by keyword, so an override must keep the names.
HOOK_PARAMETERS = ("self", "request_output", "request_output_state", "prepend_input")


class StockBackendMismatch(RuntimeError):
    """The stock backend is missing, or lacks the hook this backend overrides."""


def stock_backend_dir() -> Path:
    """``$LLM_SERVING_STOCK_VLLM_BACKEND_DIR``, else the NGC image's backend folder."""
    override = os.environ.get(STOCK_BACKEND_DIR_ENV)
    return Path(override) if override else DEFAULT_STOCK_BACKEND_DIR


def check_response_hook(module: ModuleType) -> type:
    """Return the stock ``GenerateRequest`` class, or raise naming what differs from
    `RESPONSE_HOOK` with `HOOK_PARAMETERS`."""
    where = getattr(module, "__file__", module.__name__)
    request_class = getattr(module, "GenerateRequest", None)
    method = getattr(request_class, "create_response", None)
    if not isinstance(request_class, type) or method is None:
        raise StockBackendMismatch(
            f"the stock vLLM backend ({where}) has no GenerateRequest.create_response; this "
            f"backend overrides {RESPONSE_HOOK} and cannot serve this Triton release"
        )
    found = tuple(inspect.signature(method).parameters)
    if found != HOOK_PARAMETERS:
        raise StockBackendMismatch(
            f"the stock vLLM backend's GenerateRequest.create_response takes {found}, this "
            f"backend overrides it with {HOOK_PARAMETERS}"
        )
    return request_class


def load_stock_backend(directory: Path | None = None) -> ModuleType:
    """Import the stock backend's ``model.py`` (once per process) and check its hook."""
    loaded = sys.modules.get(MODULE_NAME)
    if loaded is not None:
        return loaded
    folder = directory if directory is not None else stock_backend_dir()
    path = folder / "model.py"
    if not path.is_file():
        raise StockBackendMismatch(
            f"no stock vLLM backend at {path}; set {STOCK_BACKEND_DIR_ENV} to its folder"
        )
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
        check_response_hook(module)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    return module
