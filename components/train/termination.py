"""SIGTERM (or SIGINT, Ctrl-C) at any moment of a training process: never swallowed, always an exit with the
retryable code 143, after a checkpoint when a step was taken.

TensorFlow installs its own SIGTERM handler (its preemption notifier, which only logs) while it creates a
multi-worker strategy, and holds the GIL while it waits there for the peers, so a Python handler cannot be
relied on. So the signal is blocked in every thread, from the start of the process (before TensorFlow starts
any thread; every thread inherits the block): no handler ever runs, the signal stays pending, and one watcher
thread takes it with `sigtimedwait` and raises the flag. What the flag does depends on where the process is:

- during start-up (no step taken in this attempt): `check()` raises `Terminated` at the next phase boundary,
  and the process exits 143 at once, with nothing to save;
- in the loop: the flag rides the step's all-reduce, every worker checkpoints the same step and exits 143.

Katib's early stopping ends a trial the same way: its metrics collector writes "early-stopped" into
`/var/log/katib/<pid of the trial's shell>.pid`, then sends the training process SIGTERM (kubeflow/katib v0.19.0
`cmd/metricscollector/v1beta1/file-metricscollector/main.go`). A SIGTERM with that mark beside it is no preemption:
its flag rides the all-reduce too, and every worker checkpoints and exits 0, so that neither the TrainJob runtime's
"Preempted" rule nor TFJob's ExitCode policy restarts a trial Katib stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

# SIGHUP too: a closed terminal or a dropped session stops the training as SIGTERM does (a checkpoint, exit 143).
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


# Where Katib's metrics collector marks a trial it stops early (the folder of its default metrics file).
KATIB_FOLDER = Path(os.environ.get("CIFAR10_PIPELINE_KATIB_FOLDER", "/var/log/katib"))
KATIB_EARLY_STOPPED = "early-stopped"


def _parent_of(pid: int) -> int | None:
    try:  # reader: the kernel's one-line status of a process: "pid (name) state ppid ..."
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def stopped_early_by_katib(folder: Path | None = None) -> bool:
    """Whether Katib marked this process's trial as stopped early: the mark file of the trial's shell, our parent or
    (a worker under its supervisor, components/train/supervisor.py) our grandparent, says so."""
    for pid in (os.getppid(), _parent_of(os.getppid())):
        mark = (folder or KATIB_FOLDER) / f"{pid}.pid"
        try:  # reader: Katib's one-line mark file
            if pid and mark.read_text(encoding="utf-8", errors="replace").strip() == KATIB_EARLY_STOPPED:
                return True
        except OSError:
            continue
    return False


class Terminated(Exception):  # noqa: N818 (a signal, not an error)
    """SIGTERM or SIGINT came before the first step of this attempt: nothing to keep, exit 143 at once."""


def block_for_this_process() -> None:
    """Block SIGTERM and SIGINT in this thread and in every thread started after it (TensorFlow's): call first thing
    (`python -m components.train` does it before any import)."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)


class Termination:
    """Watches for SIGTERM from a thread of its own; `requested` is the flag, `check()` the start-up test."""

    def __init__(self):
        self.requested = False
        self.stopped_early = False  # the signal was Katib's early stopping: nothing to retry
        self.signal_name = "SIGTERM"
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._previous_mask: set | None = None
        self._previous_handlers: dict = {}

    def install(self) -> Termination:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals belong to the main thread's process set-up: leave them alone
        self._previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # blocked already in a CLI run
        # A thread started before the block (when training runs inside another program) may still receive it:
        # record it there too, instead of dying by the default action.
        self._previous_handlers = {
            number: signal.signal(number, lambda number, _frame: self._record(number)) for number in _SIGNALS
        }
        self._watcher = threading.Thread(target=self._watch, name="sigterm-watcher", daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            received = signal.sigtimedwait(_SIGNALS, 0.2)
            # A stopped and continued process (SIGSTOP, SIGCONT: Ctrl-Z and fg, a debugger, a frozen cgroup) wakes
            # from the wait with a siginfo of no signal taken: only a signal of the set is one.
            if received is not None and received.si_signo in _SIGNALS:
                self._record(received.si_signo)

    def _record(self, number: int = signal.SIGTERM) -> None:
        if not self.requested:
            self.signal_name = signal.Signals(number).name
            self.stopped_early = number == signal.SIGTERM and stopped_early_by_katib()
            if self.stopped_early:
                logger.warning("SIGTERM from Katib's early stopping: stopping after a checkpoint, exit 0 (no retry)")
            else:
                logger.warning(
                    "%s received: stopping (after a checkpoint if a step was taken), exit 143", self.signal_name
                )
        self.requested = True

    def check(self, phase: str) -> None:
        """Between start-up phases: stop now if SIGTERM came."""
        if self.requested:
            raise Terminated(f"{self.signal_name} during start-up ({phase}); nothing was trained in this attempt")

    def uninstall(self) -> None:
        """Stop watching and put the thread's signal mask back (in a CLI run: SIGTERM stays blocked to the end)."""
        if self._watcher is not None:
            self._stop.set()
            self._watcher.join()
            self._watcher = None
            for number, handler in self._previous_handlers.items():
                signal.signal(number, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous_mask)
