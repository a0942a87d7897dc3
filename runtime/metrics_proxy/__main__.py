"""``python -m runtime.metrics_proxy``: the sidecar's command, configured from the environment."""

from __future__ import annotations

import sys

from runtime.metrics_proxy.server import run_from_env

if __name__ == "__main__":
    sys.exit(run_from_env())
