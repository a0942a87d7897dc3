"""``python -m runtime.entrypoint``: the serving image's ENTRYPOINT."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys

from pydantic import ValidationError

from runtime.entrypoint.errors import ExitCode
from runtime.entrypoint.runner import Entrypoint, log
from runtime.entrypoint.settings import EntrypointSettings

__all__ = ["main"]


def raise_open_files_limit() -> None:
    """Take the hard limit on open files: each relayed connection holds four to six, and a
    soft limit of 1024 (what some container runtimes set) would cap the gate at a few hundred
    clients. Triton inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit cannot be the soft one: then the soft one stays.
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> int:
    """Read the settings from the environment, run, return the exit code."""
    raise_open_files_limit()
    try:
        settings = EntrypointSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        log(f"invalid setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        return ExitCode.CONFIG

    async def run() -> int:
        return await Entrypoint(settings).run()

    try:
        import uvloop

        return uvloop.run(run())
    except ImportError:
        return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
