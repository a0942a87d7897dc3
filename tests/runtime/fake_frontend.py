"""A stand-in for the OpenAI frontend process in embedded-mode tests: answers
``/health/ready`` on ``LLM_SERVING_FRONTEND_PORT`` and records the ``LLM_SERVING_FRONTEND_*``
environment (and ``LLM_SERVING_CATALOG_DIR``) it was started with into
``FAKE_FRONTEND_RECORD``. Never used by product code."""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from runtime.constraints.catalog import CATALOG_DIR_ENV


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> int:
    record = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("LLM_SERVING_FRONTEND_") or k == CATALOG_DIR_ENV
    }
    Path(os.environ["FAKE_FRONTEND_RECORD"]).write_text(json.dumps(record))
    server = HTTPServer(("127.0.0.1", int(os.environ["LLM_SERVING_FRONTEND_PORT"])), _Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
