"""A stand-in for S3 Cross-Region Replication: an HTTP proxy in front of moto's S3 server.

moto (5.2) stores a bucket's replication configuration but answers ``GetBucketReplication`` with
every rule's filter reset to ``Prefix: ""``, never replicates, and never sends
``x-amz-replication-status``. This proxy forwards every request to moto unchanged and adds only
that: it keeps the configuration as put and returns it, and an object written under an enabled
rule's prefix reports ``PENDING`` on ``HeadObject``/``GetObject`` until the test's script for
that key says otherwise (``COMPLETED``, ``FAILED``). Objects written before the rule report no
status, as in S3, where CRR never copies them. Nothing is copied to the destinations.
"""

from __future__ import annotations

import http.client
import threading
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["ReplicationStandIn"]

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)


def _text(element: ET.Element | None, name: str) -> str | None:
    found = None if element is None else element.find(_NS + name)
    return None if found is None else (found.text or "")


def _rule_prefixes(config: bytes) -> list[str]:
    """The key prefixes of the enabled rules; a tag filter matches none of our untagged objects."""
    prefixes = []
    for rule in ET.fromstring(config).iter(_NS + "Rule"):
        if _text(rule, "Status") != "Enabled":
            continue
        legacy = _text(rule, "Prefix")
        filter_ = rule.find(_NS + "Filter")
        if filter_ is None:
            prefixes.append(legacy or "")
        elif filter_.find(_NS + "Tag") is None and filter_.find(_NS + "And") is None:
            prefixes.append(_text(filter_, "Prefix") or "")
    return prefixes


@dataclass
class _State:
    configs: dict[str, bytes] = field(default_factory=dict)
    """Bucket -> the ``ReplicationConfiguration`` document as put."""
    reads: dict[tuple[str, str], int] = field(default_factory=dict)
    """(bucket, key) of objects written under a rule -> reads since the last write."""
    scripts: dict[str, list[str]] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)
    deny: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ReplicationStandIn:
    """The proxy on a free loopback port; `url` is the endpoint to give boto3.

    `script` sets the statuses the next reads of a replicated key see, and again after each
    write (the last one sticks; unscripted keys stay ``PENDING``). `log` lists, in order,
    ``("write", key)`` for each object written and ``(status, key)`` the first time a read is
    answered with that status. `deny` holds the S3 actions (``GetBucketReplication``) to answer
    with 403 AccessDenied.
    """

    def __init__(self, upstream: str) -> None:
        self._state = _State()
        target = urlsplit(upstream)
        handler = type("Handler", (_Handler,), {"state": self._state, "upstream": target.netloc})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> ReplicationStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, key: str, statuses: Sequence[str]) -> None:
        with self._state.lock:
            self._state.scripts[key] = list(statuses)
            for tracked in self._state.reads:
                if tracked[1] == key:
                    self._state.reads[tracked] = 0

    @property
    def log(self) -> list[tuple[str, str]]:
        with self._state.lock:
            return list(self._state.log)

    @property
    def deny(self) -> set[str]:
        return self._state.deny


class _Handler(BaseHTTPRequestHandler):
    state: _State
    upstream: str
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read the log of writes and statuses instead."""

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _handle(self) -> None:
        body = self._body()
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        bucket, _, key = unquote(url.path).lstrip("/").partition("/")
        state = self.state
        if not key and "replication" in query and self.command == "GET":
            if "GetBucketReplication" in state.deny:
                return self._reply(403, {"Content-Type": "application/xml"}, _ACCESS_DENIED)
            with state.lock:
                config = state.configs.get(bucket)
            if config is not None:  # as put: moto's own answer loses every rule's filter
                return self._reply(200, {"Content-Type": "application/xml"}, config)
        status, headers, data = self._forward(body)
        ok = 200 <= status < 300
        with state.lock:
            if not key and "replication" in query and ok:
                if self.command == "PUT":
                    state.configs[bucket] = body
                elif self.command == "DELETE":
                    state.configs.pop(bucket, None)
            elif key and ok and self._writes(query):
                config = state.configs.get(bucket)
                if config is not None and any(key.startswith(p) for p in _rule_prefixes(config)):
                    state.reads[bucket, key] = 0  # S3 marks a new version PENDING on write
                else:
                    state.reads.pop((bucket, key), None)
                state.log.append(("write", key))
            elif key and ok and self.command == "DELETE" and not query:
                state.reads.pop((bucket, key), None)
            elif key and ok and self.command in ("GET", "HEAD") and (bucket, key) in state.reads:
                headers["x-amz-replication-status"] = self._status(bucket, key)
        self._reply(status, headers, data)

    def _writes(self, query: dict[str, list[str]]) -> bool:
        """PutObject (and CopyObject), or CompleteMultipartUpload: a new object version."""
        if self.command == "PUT":
            return not query  # a part (partNumber, uploadId) or a subresource (?tagging) is not
        return self.command == "POST" and "uploadId" in query

    def _status(self, bucket: str, key: str) -> str:
        reads = self.state.reads[bucket, key]
        self.state.reads[bucket, key] = reads + 1
        script = self.state.scripts.get(key) or ["PENDING"]
        status = script[min(reads, len(script) - 1)]
        if (status, key) not in self.state.log:
            self.state.log.append((status, key))
        return status

    def _forward(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            if self.command == "HEAD":  # the object's size, though no body follows
                kept["Content-Length"] = response.getheader("Content-Length", "0")
            return response.status, kept, data
        finally:
            connection.close()

    def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self.send_response_only(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
