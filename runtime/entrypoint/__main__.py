"""``python -m runtime.entrypoint``: the serving image's ENTRYPOINT."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from runtime.entrypoint.errors import ExitCode
from runtime.entrypoint.runner import Entrypoint, log
from runtime.entrypoint.settings import EntrypointSettings
from runtime.settings_env import parse_command_line, setting_errors

__all__ = ["main"]

DESCRIPTION = (
    "The serving image's entrypoint: locate and verify the model package, unpack it, install "
    "its vLLM plugins, wipe the multiprocess metrics folder, check the Triton/vLLM pair, render "
    "the Triton model repository, start Triton (or the OpenAI frontend with Triton embedded), "
    "which binds the public gRPC port once the model has loaded, and wait until it is ready; "
    "on SIGTERM, drain and stop. It takes no arguments: everything is read from the "
    "environment variables below."
)


def raise_open_files_limit() -> None:
    """Take the hard limit on open files, for Triton, which inherits it: it holds one per
    client connection besides its model files, and a soft limit of 1024 (what some container
    runtimes set) would cap it at fewer clients than that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit cannot be the soft one: then the soft one stays.
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    """Read the settings from the environment, run, return the exit code; ``argv`` (default
    the command line's) may only ask for ``--help``."""
    parse_command_line("python -m runtime.entrypoint", DESCRIPTION, EntrypointSettings, argv)
    raise_open_files_limit()
    try:
        settings = EntrypointSettings()
    except ValidationError as exc:
        log(f"invalid setting {setting_errors(EntrypointSettings, exc)}")
        return ExitCode.CONFIG

    async def run() -> int:
        return await Entrypoint(settings).run()

    try:
        import uvloop

        code = uvloop.run(run())
    except ImportError:
        code = asyncio.run(run())
    _ignore_stop_signals()
    return code


def _ignore_stop_signals() -> None:
    """Once the servers are stopped and the exit code is decided, a late SIGTERM or SIGINT (a
    second one) must not turn it into a signal death: as the interpreter tears down, Python
    gives every signal it handled its default action back, and leaves only ignored ones be."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
