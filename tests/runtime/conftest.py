"""Shared fixtures of the runtime tests: moto's S3 server over real HTTP on loopback, and the
stop of every pod a test started."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.runtime.pod import Pod


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server mode on a free loopback port (the real S3 HTTP API, no AWS)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> dict[str, str]:
    """Fake credentials and the endpoint, as environment for boto3 and subprocesses."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_client(s3_env: dict[str, str]) -> Any:
    return boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(autouse=True)
def pods_stopped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every pod the test started is stopped when it ends, failed or not: else a failed
    assertion leaves its entrypoint and Triton stand-in running under the tests that follow."""
    started: list[Pod] = []
    start = Pod.start

    def recorded(pod: Pod) -> Pod:
        started.append(pod)
        return start(pod)

    monkeypatch.setattr(Pod, "start", recorded)
    yield
    for pod in started:
        pod.stop_if_running()
