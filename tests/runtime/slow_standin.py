"""The KServe ``tritonserver`` stand-in (tests/support) with test knobs from the environment:
a per-token delay (``STANDIN_TOKEN_DELAY_SECONDS``), so tests can have requests in flight at
SIGTERM; a hold (``STANDIN_HOLD_UNTIL_FILE``: each generation, once its request is recorded,
waits until that file exists), so a test decides when in-flight requests may finish; and a
readiness window (``STANDIN_UNREADY_AFTER_SECONDS`` / ``STANDIN_READY_AGAIN_AFTER_SECONDS``) to
model a backend health check failing for a while. A test helper only; never imported by product
code."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support import kserve_server

_init = kserve_server.KServeStandIn.__init__


def _slow_init(self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("token_delay_s", float(os.environ.get("STANDIN_TOKEN_DELAY_SECONDS", "0")))
    _init(self, *args, **kwargs)


_generate = kserve_server.KServeStandIn._generate


async def _held_generate(
    self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    hold = os.environ.get("STANDIN_HOLD_UNTIL_FILE")
    while hold and not Path(hold).exists():
        await asyncio.sleep(0.02)
    async for response in _generate(self, *args, **kwargs):
        yield response


_ready = kserve_server.KServeStandIn.ready.fget
assert _ready is not None


def _windowed_ready(self: kserve_server.KServeStandIn) -> bool:
    # Measured from the end of loading, like a health check that fails later on.
    lost = float(os.environ.get("STANDIN_UNREADY_AFTER_SECONDS", "inf"))
    back = float(os.environ.get("STANDIN_READY_AGAIN_AFTER_SECONDS", "inf"))
    since = time.monotonic() - self._started_at - self.load_seconds
    return bool(_ready(self)) and not (lost <= since < back)


if __name__ == "__main__":
    kserve_server.KServeStandIn.__init__ = _slow_init  # type: ignore[method-assign]
    kserve_server.KServeStandIn._generate = _held_generate  # type: ignore[method-assign]
    kserve_server.KServeStandIn.ready = property(_windowed_ready)  # type: ignore[method-assign,assignment]
    sys.exit(kserve_server.main())
