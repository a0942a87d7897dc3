"""The KServe ``tritonserver`` stand-in (tests/support) with two test knobs from the
environment: a per-token delay (``STANDIN_TOKEN_DELAY_SECONDS``), so tests can have requests in
flight at SIGTERM, and a readiness window (``STANDIN_UNREADY_AFTER_SECONDS`` /
``STANDIN_READY_AGAIN_AFTER_SECONDS``) to model a backend health check failing for a while.
A test helper only; never imported by product code."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from tests.support import kserve_server

_init = kserve_server.KServeStandIn.__init__


def _slow_init(self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("token_delay_s", float(os.environ.get("STANDIN_TOKEN_DELAY_SECONDS", "0")))
    _init(self, *args, **kwargs)


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
    kserve_server.KServeStandIn.ready = property(_windowed_ready)  # type: ignore[method-assign,assignment]
    sys.exit(kserve_server.main())
