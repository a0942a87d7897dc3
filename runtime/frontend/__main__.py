"""``python -m runtime.frontend``: serve with uvicorn, settings from the environment."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn
from pydantic import ValidationError

from runtime.frontend.app import create_app
from runtime.frontend.settings import FrontendSettings
from runtime.settings_env import parse_command_line, setting_errors

__all__ = ["main"]

DESCRIPTION = (
    "The OpenAI-compatible HTTP API (/v1/...) in front of Triton's KServe v2 gRPC endpoint, "
    "served by uvicorn until SIGTERM, which lets the requests in flight finish. It takes no "
    "arguments: everything is read from the environment variables below."
)


def _exit_drained(signum: int, frame: FrameType | None) -> None:
    # uvicorn handles SIGTERM itself (graceful shutdown: in-flight requests finish), then
    # re-raises it under the handler it found, which by default kills the process (status
    # -15). The shutdown was clean, so exit 0: the entrypoint reads the status to tell a
    # drained frontend from a killed one. Before uvicorn starts, SIGTERM just ends the process.
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Read settings, build the app, serve until SIGTERM; a bad setting exits 1 with one line.
    ``argv`` (default the command line's) may only ask for ``--help``."""
    parse_command_line("python -m runtime.frontend", DESCRIPTION, FrontendSettings, argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, _exit_drained)
    try:
        settings = FrontendSettings()
    except ValidationError as exc:
        print(
            f"llm-serving frontend: invalid setting {setting_errors(FrontendSettings, exc)}",
            file=sys.stderr,
        )
        return 1
    try:
        app = create_app(settings)
    except ValueError as exc:
        print(f"llm-serving frontend: {exc}", file=sys.stderr)
        return 1
    # uvloop and httptools are dependencies: named here, so that a missing one fails start-up
    # instead of silently serving on the slower pure-Python loop and parser ("auto").
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="info",
        timeout_keep_alive=settings.keep_alive_s,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
