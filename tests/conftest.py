"""Suite-wide settings: property tests explore new examples locally and replay fixed ones in CI."""

from __future__ import annotations

import os

from hypothesis import settings

# CI (CI=true) must not fail on an example that no change of ours introduced: it replays a
# derandomized set, while local runs keep searching with fresh seeds.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
