"""A worker's supervisor: the process that answers for a training worker while TensorFlow cannot.

While a worker forms its cluster, TensorFlow waits for the peers without a bound, holding the GIL (no Python thread
of the process runs, so no watchdog and no signal handler can act) with its own SIGTERM handler installed. A peer
that answers on its port but never joins (it stopped after starting; the address belongs to something else) would
hang the worker for ever, deaf to SIGTERM. So a worker (launcher `worker`) runs as two processes: this supervisor,
which imports no TensorFlow and so always answers, and the worker proper, the same command, started by it and
marked as supervised. The worker reports its phase through a pipe (`report_phase`); the supervisor

- bounds joining, from the start of the wait for peers to the formed cluster, by `--peer-timeout-seconds` (plus
  `JOIN_SLACK_SECONDS`, so that the worker's own message, naming the peers that never started, wins when it
  applies): past it, the worker is killed and the supervisor exits 1 naming the peers that did not join;
- passes SIGTERM and SIGINT on as SIGTERM: a worker that has joined checkpoints and exits 143 by itself; one that
  has not (there is nothing to save) gets `STOP_GRACE_SECONDS`, then is killed, and the supervisor exits 143;
- ends with the worker's exit code (death by a signal as 128 + its number), and takes the worker with it if it is
  itself killed (PR_SET_PDEATHSIG);
- in a training job's pod, watches the lease of the step that launched the job (components/train/step_lease.py):
  when it lapses, deletes the job (its pods then stop with their grace period); when it cannot, stops the worker
  (SIGTERM, a checkpoint) and exits 1, a final error for both job kinds, so nothing trains on for a step that is
  gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import time

from components.common import exit_codes

logger = logging.getLogger(__name__)

SUPERVISED = "CIFAR10_PIPELINE_SUPERVISED"  # set in the worker proper: it runs, and does not supervise again
PHASE_FD = "CIFAR10_PIPELINE_PHASE_FD"  # the pipe the worker reports its phase on
JOIN_SLACK_SECONDS = 3.0
STOP_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.2
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def is_supervised(environment=None) -> bool:
    return bool((os.environ if environment is None else environment).get(SUPERVISED))


def report_phase(phase: str, **details) -> None:
    """In a supervised worker: tell the supervisor where the worker is (`joining`, with `worker` and `peers`;
    `joined`). Elsewhere nothing."""
    descriptor = os.environ.get(PHASE_FD)
    if not descriptor:
        return
    message = json.dumps({"phase": phase, **details}) + "\n"
    with contextlib.suppress(OSError):  # the supervisor is gone: the parent-death signal ends this process
        os.write(int(descriptor), message.encode())


def die_with_parent(parent_pid: int, signal_number: int) -> None:
    """Receive `signal_number` when the parent process dies, however it dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal_number, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.warning("cannot ask to be stopped with the parent process on this system")
    if os.getppid() != parent_pid:  # it died before the request took effect
        os.kill(os.getpid(), signal_number)


def exit_code_of(returncode: int) -> int:
    """A child's `returncode` as a shell reports it: death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Runs `command` as the supervised worker and watches it (see the module's description)."""

    def __init__(self, command: list[str], peer_timeout_seconds: float, stop_grace_seconds: float = STOP_GRACE_SECONDS):
        self.command = command
        self.peer_timeout_seconds = peer_timeout_seconds
        self.stop_grace_seconds = stop_grace_seconds
        self.phase = "starting"
        self.worker_name = "worker"
        self.peers: dict[str, str] = {}
        self.join_deadline: float | None = None
        self.signal_name: str | None = None
        self.stop_deadline: float | None = None
        self._buffer = b""
        self._signalled = False
        self.orphaned = False  # the launching step is gone and the job could not be deleted

    def run(self) -> int:
        from components.common import access, exit_codes
        from components.train import step_lease

        try:
            step_lease.check_worker_rights()
        except access.AccessError as error:
            logger.error("%s", error)
            return exit_codes.BAD_INPUT  # final: the job fails at once, no retry lacks it less
        read_end, write_end = os.pipe()
        parent = os.getpid()
        environment = {**os.environ, SUPERVISED: "1", PHASE_FD: str(write_end)}
        process = subprocess.Popen(
            self.command,
            env=environment,
            pass_fds=(write_end,),
            preexec_fn=lambda: die_with_parent(parent, signal.SIGKILL),  # no thread runs here: see the module
        )
        os.close(write_end)
        previous = {number: signal.signal(number, self._on_signal) for number in _SIGNALS}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_SIGNALS))
        from components.train import step_lease

        step_lease.watch_from_environment(self._on_step_lapse)
        try:
            return self._watch(process, read_end)
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            os.close(read_end)
            if process.poll() is None:
                process.kill()
                process.wait()

    def _on_signal(self, number, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name
        self._signalled = True

    def _on_step_lapse(self, reason: str, job: str) -> None:
        """From the lease's watching thread: the launching step is gone."""
        from components.train import step_lease

        if not step_lease.delete_own_job(job, reason):
            self.orphaned = True
            if self.signal_name is None:
                self.signal_name = "the launching step's end"
            self._signalled = True

    def _watch(self, process: subprocess.Popen, read_end: int) -> int:
        pipe_open = True
        while True:
            if pipe_open:
                ready, _, _ = select.select([read_end], [], [], POLL_SECONDS)
                if ready:
                    pipe_open = self._read(read_end)
            else:
                time.sleep(POLL_SECONDS)
            code = process.poll()
            if code is not None:
                return exit_codes.FAILED if self.orphaned else exit_code_of(code)
            if self._signalled:
                self._signalled = False
                self._pass_on(process)
            now = time.monotonic()
            if self.stop_deadline is not None and now > self.stop_deadline:
                logger.warning(
                    "%s: still %s %.0f s after %s (nothing trained in this attempt): stopping it, exit %d",
                    self.worker_name, self.phase, self.stop_grace_seconds, self.signal_name, exit_codes.PREEMPTED,
                )  # fmt: skip
                _kill(process)
                return exit_codes.PREEMPTED
            if self.join_deadline is not None and now > self.join_deadline:
                logger.error("%s", self._join_failure())
                _kill(process)
                return exit_codes.FAILED

    def _read(self, read_end: int) -> bool:
        chunk = os.read(read_end, 4096)  # reader: the training process's pipe, 4096 bytes at most
        if not chunk:
            return False
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._on_phase(json.loads(line))  # reader: a phase line our own worker process wrote
        return True

    def _on_phase(self, message: dict) -> None:
        self.phase = message["phase"]
        if self.phase == "joining":
            self.worker_name = message.get("worker", self.worker_name)
            self.peers = message.get("peers", {})
            self.join_deadline = time.monotonic() + self.peer_timeout_seconds + JOIN_SLACK_SECONDS
        elif self.phase == "joined":
            self.join_deadline = None
            self.stop_deadline = None  # the worker answers SIGTERM itself from here on

    def _pass_on(self, process: subprocess.Popen) -> None:
        logger.warning("%s received: passing it on to %s (%s)", self.signal_name, self.worker_name, self.phase)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        if self.phase != "joined" and self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.stop_grace_seconds

    def _join_failure(self) -> str:
        peers = ", ".join(f"{name} ({address})" for name, address in sorted(self.peers.items())) or "its peers"
        return (
            f"{self.worker_name}: the cluster did not form within {self.peer_timeout_seconds:g} s: {peers} answered "
            "on their ports but never joined (a worker that stopped after starting, or an address that is not a "
            "worker's); check those workers' logs (or raise --peer-timeout-seconds; in a pipeline, train_options' "
            "peer_timeout_seconds)"
        )


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
