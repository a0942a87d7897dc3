"""The entrypoint's stage failure and its exit codes."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["STAGES", "ExitCode", "StageFailed"]

STAGES = ("locate", "unpack", "plugins", "metrics", "compat", "render", "start", "gate")


class ExitCode(IntEnum):
    """How the entrypoint ended (stage ``n`` failing exits ``10 + n``)."""

    DRAINED = 0
    """SIGTERM: the public port closed, in-flight requests finished, Triton stopped cleanly."""
    INTERNAL = 1
    """An unexpected error outside the stages (serving, draining): a bug, named on stderr; the
    servers were stopped."""
    CONFIG = 2
    """The environment is invalid, or the health port it names cannot be bound (named on
    stderr)."""
    STAGE_LOCATE = 11
    STAGE_UNPACK = 12
    STAGE_PLUGINS = 13
    STAGE_METRICS = 14
    STAGE_COMPAT = 15
    STAGE_RENDER = 16
    STAGE_START = 17
    STAGE_GATE = 18
    SERVER_EXITED = 20
    """Triton (or the frontend) exited on its own while serving."""
    DRAIN_TIMEOUT = 21
    """SIGTERM: the drain deadline passed with requests in flight (Triton cut them, or did not
    stop and was killed)."""
    DRAIN_SERVER_EXITED = 22
    """SIGTERM: a server process exited abnormally (non-zero, or by a signal) during the drain,
    before the deadline: in-flight requests may have failed."""


class StageFailed(Exception):
    """A stage cannot complete; ``fix`` tells the operator what to change."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix
