"""Entry point that ``pulumi preview --policy-pack policy`` runs: serves the pack to the engine."""

import sys
from pathlib import Path

# Pulumi runs this file with the pack's folder first on sys.path; the validators are imported as
# the ``policy`` package, so its parent (the repository root) must be importable too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policy.pack import PACK_NAME, build_policies

PolicyPack(
    name=PACK_NAME,
    policies=build_policies(),
    enforcement_level=EnforcementLevel.MANDATORY,
)
