"""The KServe ``tritonserver`` stand-in (tests/support) with a per-token delay from the
environment (``STANDIN_TOKEN_DELAY_SECONDS``), so tests can have requests in flight at SIGTERM.
A test helper only; never imported by product code."""

from __future__ import annotations

import os
import sys
from typing import Any

from tests.support import kserve_server

_init = kserve_server.KServeStandIn.__init__


def _slow_init(self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("token_delay_s", float(os.environ.get("STANDIN_TOKEN_DELAY_SECONDS", "0")))
    _init(self, *args, **kwargs)


if __name__ == "__main__":
    kserve_server.KServeStandIn.__init__ = _slow_init  # type: ignore[method-assign]
    sys.exit(kserve_server.main())
