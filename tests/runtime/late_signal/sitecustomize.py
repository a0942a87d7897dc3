"""Test hook, never shipped: first on a pod's ``PYTHONPATH``, it has ``python -m
runtime.entrypoint`` send itself the signal named by ``POD_TEST_LATE_SIGNAL`` while its
interpreter tears down its modules, where a second SIGTERM from an impatient caller can land.

By then Python has given every signal it handled back its default action (``_PySignal_Fini``
runs before the modules are destroyed), so only an ignored signal is still ignored.
"""

import functools
import os
import signal
import sys


class _SignalAtTeardown:
    """Sends the signal from its finalizer, which runs when this module's globals are cleared."""

    def __init__(self, sig: signal.Signals) -> None:
        self._send = functools.partial(os.kill, os.getpid(), sig)

    def __del__(self) -> None:
        self._send()


_name = os.environ.get("POD_TEST_LATE_SIGNAL")
if _name and sys.orig_argv[1:3] == ["-m", "runtime.entrypoint"]:
    _late = _SignalAtTeardown(signal.Signals[_name])
