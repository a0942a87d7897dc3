"""IAM trust policies that let an AWS service assume a component's role."""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["service_trust_policy"]


def service_trust_policy(service: str, actions: Sequence[str] = ("sts:AssumeRole",)) -> str:
    """The assume-role policy document (JSON) trusting ``service``, e.g. ``ec2.amazonaws.com``."""
    action: str | list[str] = actions[0] if len(actions) == 1 else list(actions)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": action}],
        }
    )
