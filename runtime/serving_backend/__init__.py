"""The Triton backend the serving image renders for ``vllm`` packages: NVIDIA's stock vLLM
backend, unchanged, plus vLLM's prompt log-probabilities for the requests that ask for them,
each request's prefix-cached prompt tokens, each finished choice's ``stop_reason``, and
vLLM's per-request ``cache_salt``.

``/v1/score`` ranks candidates by log p(candidate | prompt) from one prefill, which needs vLLM's
``RequestOutput.prompt_logprobs``; the stock backend neither declares an output for them nor
returns them. This package is a Triton *Python-based backend* (``model.py`` under
``/opt/tritonserver/backends/<BACKEND_NAME>/``, chosen by ``backend: "<BACKEND_NAME>"`` in
``config.pbtxt``) that imports the stock backend from its own folder and subclasses it:

- :mod:`runtime.serving_backend.stock` finds and imports the stock backend and checks that it
  has the response hook this package overrides (`RESPONSE_HOOK`);
- :mod:`runtime.serving_backend.prompt_logprobs` encodes ``RequestOutput.prompt_logprobs`` as
  the JSON the frontend reads;
- :mod:`runtime.serving_backend.choices` and :mod:`runtime.serving_backend.stream_interval`
  shape the outputs handed to the stock code (every choice of ``n``; vLLM's ``stream_interval``);
- :mod:`runtime.serving_backend.sampling_parameters` checks a request's sampling parameters as
  the stock code will read them, so a bad one is answered with vLLM's reason;
- :mod:`runtime.serving_backend.scoring` holds the two subclasses (the model and its generate
  request); ``model.py`` beside it is the file Triton loads.

Only ``scoring`` and ``model`` need Triton's Python stub (``triton_python_backend_utils``);
the other modules import anywhere.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BACKEND_NAME",
    "CACHED_TOKENS_OUTPUT",
    "CACHE_SALT_PARAMETER",
    "DEFAULT_STOCK_BACKEND_DIR",
    "INVALID_PARAMETERS",
    "MODEL_FILE",
    "PROMPT_LOGPROBS_OUTPUT",
    "RESPONSE_HOOK",
    "STOCK_BACKEND_DIR_ENV",
    "STOCK_BACKEND_NAME",
    "STOP_REASON_OUTPUT",
]

#: The backend name ``config.pbtxt`` names and the folder under ``/opt/tritonserver/backends``.
BACKEND_NAME = "llm_serving_vllm"
#: NVIDIA's vLLM backend, which ours extends (and which models fall back to when it cannot).
STOCK_BACKEND_NAME = "vllm"
#: Where the NGC ``-vllm-python-py3`` images keep the stock backend.
DEFAULT_STOCK_BACKEND_DIR = Path("/opt/tritonserver/backends") / STOCK_BACKEND_NAME
#: Overrides `DEFAULT_STOCK_BACKEND_DIR` (tests point it at a stand-in of the stock backend).
STOCK_BACKEND_DIR_ENV = "LLM_SERVING_STOCK_VLLM_BACKEND_DIR"
#: The output this backend adds: per request, one JSON string of ``RequestOutput.prompt_logprobs``.
PROMPT_LOGPROBS_OUTPUT = "prompt_logprobs"
#: The output this backend adds to a generation's last response: vLLM's
#: ``RequestOutput.num_cached_tokens``, the prompt tokens its prefix cache served.
CACHED_TOKENS_OUTPUT = "num_cached_tokens"
#: The output this backend adds to responses in which a choice has finished: per choice, the
#: JSON of vLLM's ``CompletionOutput.stop_reason`` (the stop string or token id that ended it,
#: ``null`` for the end of sequence or a choice still running).
STOP_REASON_OUTPUT = "stop_reason"
#: The request parameter (KServe ``parameters``, beside the ``sampling_parameters`` tensor)
#: whose string becomes the prompt's ``cache_salt``: only requests with the same salt share
#: cached prefix blocks.
CACHE_SALT_PARAMETER = "cache_salt"
#: How the backend begins the reason for a request that vLLM refuses as given (its sampling
#: parameters, or a structured output that does not compile); the frontend answers it as a 400.
INVALID_PARAMETERS = "invalid sampling parameters"
#: The stock backend's method that builds a generate response from one vLLM ``RequestOutput``,
#: as ``module:Class.method`` relative to the stock backend's folder. ``images/compat.toml``
#: records each pair's hook; ours is rendered only for pairs whose hook is this one.
RESPONSE_HOOK = "utils.request:GenerateRequest.create_response"
#: The file Triton loads from the backend folder (installed there by the serving Dockerfile).
MODEL_FILE = Path(__file__).resolve().parent / "model.py"
