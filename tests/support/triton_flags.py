"""tritonserver's command line, parsed as tritonserver parses it: the tritonserver stand-in
(`tests.support.kserve_server`) refuses what the real one refuses, so a misspelled or missing
flag in the serving entrypoint's command fails the tests as it would fail in the image."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["POD_FLAGS", "TRUE_WORDS", "FlagError", "check_pod_flags", "parse_triton_flags"]


class FlagError(ValueError):
    """A command line tritonserver itself refuses; the message is what it prints."""


def _kinds(kind: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), kind)


# tritonserver's long options (server/src/command_line_parser.cc) by the kind of value each
# takes. The stand-in acts on a few and accepts the others, so a real flag passes and a
# misspelled one fails here as it would in the image.
_TRITON_FLAGS: dict[str, str] = {
    "disable-auto-complete-config": "none",
    **_kinds(
        "bool",
        "exit-on-error strict-readiness model-namespacing allow-http reuse-http-port allow-grpc "
        "reuse-grpc-port grpc-use-ssl grpc-use-ssl-mutual grpc-keepalive-permit-without-calls "
        "log-info log-warning log-error allow-metrics allow-gpu-metrics allow-cpu-metrics "
        "strict-model-config",
    ),
    **_kinds(
        "int",
        "exit-timeout-secs repository-poll-secs model-load-thread-count model-load-retry-count "
        "http-port http-thread-count grpc-port grpc-infer-allocation-pool-size "
        "grpc-keepalive-time grpc-keepalive-timeout grpc-http2-max-pings-without-data "
        "grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes "
        "grpc-max-connection-age grpc-max-connection-age-grace log-verbose metrics-port "
        "metrics-interval-ms pinned-memory-pool-byte-size buffer-manager-thread-count "
        "response-cache-byte-size trace-rate trace-count trace-log-frequency",
    ),
    "min-supported-compute-capability": "float",
    **_kinds(
        "str",
        "id model-store model-repository model-control-mode load-model http-address "
        "http-header-forward-pattern http-restricted-api grpc-address grpc-header-forward-pattern "
        "grpc-server-cert grpc-server-key grpc-root-cert grpc-infer-response-compression-level "
        "grpc-restricted-protocol log-format log-file metrics-address metrics-config "
        "trace-config cache-config cache-directory rate-limit rate-limit-resource "
        "cuda-memory-pool-byte-size cuda-virtual-address-size host-policy model-load-gpu-limit "
        "backend-directory backend-config repoagent-directory trace-file trace-level",
    ),
}
_CHOICES = {
    "model-control-mode": ("none", "poll", "explicit"),
    "grpc-infer-response-compression-level": ("none", "low", "medium", "high"),
    "rate-limit": ("execution_count", "off"),
}
TRUE_WORDS, _FALSE = ("true", "on", "1"), ("false", "off", "0")
#: What the serving entrypoint's tritonserver command must say (``runtime/entrypoint``), checked
#: with ``KSERVE_STANDIN_REQUIRE_POD_FLAGS=1``: the pod relies on each.
POD_FLAGS: dict[str, str | None] = {
    "model-repository": None,
    "model-control-mode": "explicit",  # a half-written model on the shared cache is never polled
    "load-model": None,
    "strict-readiness": "true",
    "exit-on-error": "true",
    "grpc-address": None,
    "grpc-port": None,
    "allow-http": "true",  # the entrypoint polls model readiness over HTTP
    "http-address": None,
    "http-port": None,
    "metrics-address": None,
    "metrics-port": None,
    "exit-timeout-secs": None,  # the drain deadline
}


def _bad(name: str, why: str) -> FlagError:
    return FlagError(f'Bad option: "--{name}".\n{why}')


def _check_value(name: str, kind: str, value: str) -> None:
    # Stricter than std::stoi in one way: "8001x" is refused, not read as 8001.
    if kind == "bool" and value.lower() not in (*TRUE_WORDS, *_FALSE):
        raise _bad(name, f"invalid value for bool option: {value}")
    if kind == "int" and not re.fullmatch(r"[+-]?\d+", value):
        raise _bad(name, f"Invalid option value. Got {value}")
    if kind == "float":
        try:
            float(value)
        except ValueError:
            raise _bad(name, f"Invalid option value. Got {value}") from None
    if name in _CHOICES and value.lower() not in _CHOICES[name]:
        raise _bad(name, f"invalid argument for --{name}")


def parse_triton_flags(argv: Sequence[str]) -> dict[str, list[str]]:
    """tritonserver's command line as ``{flag: [values]}``, refused where tritonserver refuses
    it: an unknown flag (abbreviations included), a missing or malformed value, a positional
    argument. ``--flag value`` and ``--flag=value`` both work, as with getopt."""
    given: dict[str, list[str]] = {}
    words = iter(argv)
    for word in words:
        if not word.startswith("--"):
            raise FlagError(f"Unexpected argument: {word}")
        name, eq, value = word[2:].partition("=")
        kind = _TRITON_FLAGS.get(name)
        if kind is None:
            raise FlagError(f"tritonserver: unrecognized option '{word}'")
        if kind == "none" and eq:
            raise FlagError(f"tritonserver: option '--{name}' doesn't allow an argument")
        if kind != "none" and not eq:
            value = next(words, None)  # type: ignore[assignment]
            if value is None:
                raise FlagError(f"tritonserver: option '--{name}' requires an argument")
        _check_value(name, kind, value)
        given.setdefault(name, []).append(value)
    return given


def check_pod_flags(given: dict[str, list[str]]) -> None:
    """Refuse a command line that lacks a flag the serving entrypoint relies on (`POD_FLAGS`)."""
    for name, wanted in POD_FLAGS.items():
        if name not in given:
            raise FlagError(f"the serving entrypoint must pass --{name}")
        value = given[name][-1].lower()
        if (
            wanted is not None
            and value != wanted
            and not (wanted == "true" and value in TRUE_WORDS)
        ):
            raise FlagError(f"the serving entrypoint must pass --{name}={wanted}, not {value}")
