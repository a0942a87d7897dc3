"""``python -m runtime.metrics_proxy``: the sidecar's command, configured from the environment."""

from __future__ import annotations

import sys

from runtime.metrics_proxy.app import ProxyConfigError
from runtime.metrics_proxy.server import serve
from runtime.metrics_proxy.settings import ProxySettings


def main() -> int:
    """Run the proxy; a configuration error prints one line and exits 1."""
    try:
        serve(ProxySettings())
    except ProxyConfigError as exc:
        print(f"metrics proxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
