"""A fanned-out prepare on one machine: `prepare_workers` processes, each a fresh interpreter running what a
pipeline's worker pod runs (`--part I`) on its share of the shards. A fresh interpreter, not a fork: a process
forked after TensorFlow ran (the leak search resizes with it) inherits its state without its threads, and its first
TensorFlow op waits for ever. Each worker reads the source itself and must find the digest the run planned with
(else the source changed while it was read: refused). A worker that dies (a signal, a crash) or says nothing for
`silence_seconds` (hung) is ended and started again, as a pipeline retries a pod, and finds its landed shards already
done; a worker that refuses the source or a setting (exit 2) ends the run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from components.common import exit_codes

logger = logging.getLogger(__name__)

WORKER_ATTEMPTS = 3  # a worker is started at most this often
POLL_SECONDS = 0.2
SILENCE_SECONDS = float(os.environ.get("CIFAR10_PIPELINE_PREPARE_WORKER_SILENCE_SECONDS", 1800))
# What a worker is told of its run: the dataset's key (source digest and settings) the run planned with.
KEY_VARIABLE = "CIFAR10_PIPELINE_PREPARE_KEY"


class WorkerRefusedError(ValueError):
    """A worker refused the source or a setting (exit 2): starting it again would not help."""


class Worker:
    """One worker process, its output passed on line by line (each line also proves it alive)."""

    def __init__(self, command: list[str], environment: dict[str, str]):
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        self.last_line = time.monotonic()
        self.last_error = ""  # the last error line it logged: what a refusal names
        self._reader = threading.Thread(target=self._pass_on, daemon=True)
        self._reader.start()

    def _pass_on(self) -> None:
        for raw in self.process.stdout:
            self.last_line = time.monotonic()
            line = raw.decode("utf-8", errors="replace")
            if " ERROR " in line:
                self.last_error = line.split(": ", 1)[-1].strip()
            sys.stderr.write(line)
            sys.stderr.flush()

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=10)


def run_local_workers(
    count: int, command_of: Callable[[int], list[str]], key: str, silence_seconds: float | None = None
) -> None:
    """`command_of(index)` for every index < `count`, each a fresh process, all at once, told the run's dataset
    `key`; each is started again when it dies or is silent for `silence_seconds`, at most WORKER_ATTEMPTS times.
    Returns when all have succeeded; raises when one refused or kept failing."""
    silence = SILENCE_SECONDS if silence_seconds is None else silence_seconds
    environment = {**os.environ, KEY_VARIABLE: key, "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    running = {index: Worker(command_of(index), environment) for index in range(count)}
    attempts = dict.fromkeys(range(count), 1)
    try:
        while running:
            time.sleep(POLL_SECONDS)
            for index, worker in list(running.items()):
                named = f"prepare worker {index} of {count}"
                code = worker.process.poll()
                if code is None and time.monotonic() - worker.last_line < silence:
                    continue
                if code is None:  # hung: ended as a dead one is
                    worker.end()
                    how = f"said nothing for {silence:.0f} s (hung?); it was ended"
                else:
                    worker.end()
                    how = f"was killed by signal {-code}" if code < 0 else f"failed (exit {code})"
                del running[index]
                if code == exit_codes.SUCCESS:
                    continue
                if code == exit_codes.BAD_INPUT:
                    raise WorkerRefusedError(f"{named}: {worker.last_error or 'refused the source or a setting'}")
                if attempts[index] >= WORKER_ATTEMPTS:
                    raise RuntimeError(f"{named} {how}, {attempts[index]} times; giving up")
                attempts[index] += 1
                logger.warning("%s %s; starting it again (attempt %d of %d)", named, how, attempts[index],
                               WORKER_ATTEMPTS)  # fmt: skip
                running[index] = Worker(command_of(index), environment)
    finally:
        for worker in running.values():  # this run failed or was stopped: its other workers end with it
            worker.end()
    logger.info("the %d prepare workers are done", count)


def check_key(key: str, origin: str) -> None:
    """In a worker started by `run_local_workers`: the dataset key it planned must be the run's; else the source
    changed between the run's read and this one's (refused, nothing of it published)."""
    expected = os.environ.get(KEY_VARIABLE)
    if expected and expected != key:
        raise ValueError(
            f"{origin}: the source changed while it was being read (this worker read dataset {key}, the run planned "
            f"{expected}); nothing was published: run again once the source is still"
        )
