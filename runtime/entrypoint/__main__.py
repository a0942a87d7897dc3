"""``python -m runtime.entrypoint``: the serving image's ENTRYPOINT."""

from __future__ import annotations

import asyncio
import sys

from pydantic import ValidationError

from runtime.entrypoint.errors import ExitCode
from runtime.entrypoint.runner import Entrypoint, log
from runtime.entrypoint.settings import EntrypointSettings

__all__ = ["main"]


def main() -> int:
    """Read the settings from the environment, run, return the exit code."""
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
