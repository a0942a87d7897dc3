"""Test hook, never shipped: first on a pod's ``PYTHONPATH``, it holds ``python -m pip`` (the
entrypoint's stage 3) until the file named by ``POD_TEST_PIP_RELEASE`` exists, having created the
one named by ``POD_TEST_PIP_HELD``, so that a test can signal while stage 3 certainly runs."""

import os
import sys
import time
from pathlib import Path

_held = os.environ.get("POD_TEST_PIP_HELD")
_release = os.environ.get("POD_TEST_PIP_RELEASE")
if _held and _release and sys.orig_argv[1:3] == ["-m", "pip"]:
    Path(_held).touch()
    _deadline = time.monotonic() + 120  # a hang guard: the test releases it within seconds
    while not Path(_release).exists() and time.monotonic() < _deadline:
        time.sleep(0.01)
