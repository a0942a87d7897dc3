"""The serving pod's entrypoint: start-up stages, the readiness gate, health and the SIGTERM
drain."""

from __future__ import annotations

from runtime.entrypoint.errors import STAGES, ExitCode, StageFailed
from runtime.entrypoint.settings import EntrypointSettings

__all__ = ["STAGES", "EntrypointSettings", "ExitCode", "StageFailed"]
