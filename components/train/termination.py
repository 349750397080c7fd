"""SIGTERM at any moment of a training process: never swallowed, always an exit with the retryable code 143.

TensorFlow installs its own SIGTERM handler (its preemption notifier, which only logs) while it creates a
multi-worker strategy, and holds the GIL while it waits there for the peers, so no Python handler can run then.
So the signal is blocked from the start of the process, before TensorFlow starts any thread (every thread
inherits the block); the main thread alone takes it, through `Termination`'s handler, except while TensorFlow
creates the strategy (`held()`), after which our handler is put back and a signal that came meanwhile is
delivered. What the signal does then depends on where the process is:

- during start-up (no step taken in this attempt): `check()` raises `Terminated` at the next phase boundary,
  and the process exits 143 at once, with nothing to save;
- in the loop: the flag rides the step's all-reduce, every worker checkpoints the same step and exits 143.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_SIGNALS = {signal.SIGTERM}


class Terminated(Exception):  # noqa: N818 (a signal, not an error)
    """SIGTERM came before the first step of this attempt: nothing to keep, exit 143 at once."""


def block_for_this_process() -> None:
    """Block SIGTERM in this thread and in every thread started after it (TensorFlow's): call first thing."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)


class Termination:
    """Records SIGTERM in the main thread; `check()` turns it into `Terminated` during start-up."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def install(self) -> Termination:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals belong to the main thread: leave them alone
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        self._installed = True
        return self

    def _handle(self, _signal_number, _frame) -> None:
        if not self.requested:
            logger.warning("SIGTERM received: stopping (after a checkpoint if a step was taken), exit code 143")
        self.requested = True

    def check(self, phase: str) -> None:
        """Between start-up phases: stop now if SIGTERM came."""
        if self.requested:
            raise Terminated(f"SIGTERM during start-up ({phase}); nothing was trained in this attempt")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Around a TensorFlow call that installs its own SIGTERM handler: the signal waits, then reaches ours."""
        if not self._installed:
            yield
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, self._handle)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)  # a signal that came meanwhile arrives now

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False
