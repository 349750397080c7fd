"""The one owner of the processes a local run starts: kfp.local's step processes live and die with `local-run`.

kfp.local starts each step as `sh -c '... python3 -m kfp.dsl.executor_main ...'` with plain `subprocess.Popen`:
nothing ties the step to the process that started it, so after a SIGTERM, a closed terminal or `kill -9` of
`local-run`, a training step (and its workers) went on for minutes, or to the end, unwatched, holding the model
directory's writer lock. Here every step starts in a process group of its own, and:

- `local-run` gets SIGINT (Ctrl-C) or SIGTERM: it passes SIGTERM to every step's group (training saves a
  checkpoint at a step every worker agrees on and exits 143), keeps reading their output while they end, and
  kills what is left after `STOP_GRACE_SECONDS`; the run is then reported as interrupted, from the checkpoints
  the workers left. A second signal kills the steps at once.
- `local-run` dies however it dies (`kill -9` included): a small reaper process, started first and holding only a
  pipe from `local-run`, sees the pipe close and does the same: SIGTERM to every step's group, then SIGKILL after
  the grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types

logger = logging.getLogger("pipeline")

STOP_GRACE_SECONDS = 300.0  # how long a stopped step may take to save its checkpoint and end
DONE = b"done\n"


class StepProcesses:
    """While `supervised()`: kfp.local's step processes, their groups, and how the run was stopped (if it was)."""

    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS):
        self.grace_seconds = grace_seconds
        self.stopped_by: int | None = None  # the signal that stopped the run
        self._groups: set[int] = set()
        self.exit_codes: list[int] = []  # of the steps that ended, in the order they ended
        self._lock = threading.Lock()
        self._reaper: subprocess.Popen | None = None

    # -- starting steps ----------------------------------------------------------------------------------------

    def _popen_class(self):
        owner = self

        class StepPopen(subprocess.Popen):
            def __init__(self, *arguments, **keywords):
                keywords["start_new_session"] = True  # a group of its own: stopped as a whole
                super().__init__(*arguments, **keywords)
                owner._started(self.pid)

            def wait(self, timeout=None):
                try:
                    return super().wait(timeout)
                finally:
                    if self.returncode is not None:
                        owner._ended(self.pid, self.returncode)

        return StepPopen

    def _started(self, pid: int) -> None:
        with self._lock:
            self._groups.add(pid)
            stopped = self.stopped_by is not None
        if self._reaper is not None and self._reaper.stdin is not None:
            with contextlib.suppress(OSError):
                self._reaper.stdin.write(f"{pid}\n".encode())
                self._reaper.stdin.flush()
        if stopped:  # started after the run was stopped (an exit handler): it ends too
            _signal_group(pid, signal.SIGTERM)

    def _ended(self, pid: int, exit_code: int) -> None:
        with self._lock:
            if pid in self._groups:
                self.exit_codes.append(exit_code)
            self._groups.discard(pid)

    def failure_exit_code(self) -> int:
        """The run's exit code after a step failed: a step's bad input (2), full disk (144) or failing store (145)
        is the run's, so that a script tells a setting to fix from a failure; anything else is 1."""
        from components.common import exit_codes

        for code in self.exit_codes:
            if code in (exit_codes.BAD_INPUT, exit_codes.NO_SPACE, exit_codes.STORE_UNAVAILABLE):
                return code
        return exit_codes.FAILED

    # -- stopping ----------------------------------------------------------------------------------------------

    def _on_signal(self, signal_number: int, _frame) -> None:
        with self._lock:
            first = self.stopped_by is None
            self.stopped_by = self.stopped_by or signal_number
            groups = sorted(self._groups)
        if not first:
            logger.warning("stopping at once (a second %s)", signal.Signals(signal_number).name)
            for group in groups:
                _signal_group(group, signal.SIGKILL)
            return
        logger.warning(
            "%s: stopping the run; training saves a checkpoint first (at most %.0f s; again to stop at once)",
            signal.Signals(signal_number).name,
            self.grace_seconds,
        )
        for group in groups:
            _signal_group(group, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, name="step-grace", daemon=True).start()

    def _kill_after_grace(self) -> None:
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline:
            with self._lock:
                if not self._groups:
                    return
            time.sleep(0.5)
        with self._lock:
            groups = sorted(self._groups)
        for group in groups:
            logger.warning("step process group %d did not end within %.0f s: killing it", group, self.grace_seconds)
            _signal_group(group, signal.SIGKILL)

    # -- the context ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def supervised(self):
        """kfp.local's subprocess runner starts its steps through this owner; SIGINT and SIGTERM stop them."""
        from kfp.local import subprocess_task_handler

        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "pipeline.step_processes", str(self.grace_seconds)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # not stopped with the terminal's group: it outlives local-run on purpose
        )
        original_module = subprocess_task_handler.subprocess
        subprocess_task_handler.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": self._popen_class()})
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            # A signal this process was started ignoring (SIGINT of a background job, nohup's SIGHUP) stays ignored.
            handlers = {
                number: signal.signal(number, self._on_signal)
                for number in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(number) is not signal.SIG_IGN
            }
        try:
            yield self
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
            subprocess_task_handler.subprocess = original_module
            self._close_reaper()

    def _close_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is None or reaper.stdin is None:
            return
        with contextlib.suppress(OSError):
            reaper.stdin.write(DONE)
            reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=10)


def _signal_group(group: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal_number)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(grace_seconds: float, stream=None) -> int:
    """The reaper: read step groups from stdin until `done` (a normal end: nothing to do) or end of file (local-run
    died): then SIGTERM to every group still alive, and SIGKILL to what is left after the grace period."""
    stream = stream or sys.stdin.buffer
    groups: list[int] = []
    for line in stream:
        if line == DONE:
            return 0
        with contextlib.suppress(ValueError):
            groups.append(int(line))
    alive = [group for group in groups if _group_alive(group)]
    for group in alive:
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [group for group in alive if _group_alive(group)]
    for group in alive:
        _signal_group(group, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is local-run's to handle, not the reaper's
    sys.exit(reap(float(sys.argv[1])))
