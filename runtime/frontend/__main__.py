"""``python -m runtime.frontend``: serve with uvicorn, settings from the environment."""

from __future__ import annotations

import logging
import sys

import uvicorn

from runtime.frontend.app import create_app
from runtime.frontend.settings import FrontendSettings

__all__ = ["main"]


def main() -> int:
    """Read settings, build the app, serve until SIGTERM; a bad setting exits 1 with one line."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        settings = FrontendSettings()
        app = create_app(settings)
    except ValueError as exc:
        print(f"llm-serving frontend: {exc}", file=sys.stderr)
        return 1
    uvicorn.run(app, host=settings.host, port=settings.port, access_log=False, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
