"""``python -m runtime.metrics_proxy``: the sidecar's command, configured from the environment."""

from __future__ import annotations

import sys

from runtime.metrics_proxy.server import run_from_env
from runtime.metrics_proxy.settings import ProxySettings
from runtime.settings_env import parse_command_line

DESCRIPTION = (
    "The metrics proxy: serves /metrics, Triton's own series merged with the vLLM and "
    "constraint-engine series that prometheus_client's multiprocess files hold, each labelled "
    "with the model and colour, and /healthz, until SIGTERM, which lets the scrapes in flight "
    "finish. It takes no arguments: everything is read from the environment variables below."
)

if __name__ == "__main__":
    parse_command_line("python -m runtime.metrics_proxy", DESCRIPTION, ProxySettings)
    sys.exit(run_from_env())
