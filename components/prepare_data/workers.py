"""A fanned-out prepare on one machine: `prepare_workers` processes forked from the one that planned the dataset (so
the source is read and indexed once), each running what a pipeline's worker pod runs on its share of the shards. A
worker that dies (a signal, a crash) is started again, as a pipeline retries a pod, and finds its landed shards
already done; a worker that refuses the source or a setting (exit 2) ends the run."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable

from components.common import exit_codes

logger = logging.getLogger(__name__)

WORKER_ATTEMPTS = 3  # a worker is started at most this often
POLL_SECONDS = 0.2


class WorkerRefusedError(ValueError):
    """A worker refused the source or a setting (exit 2): starting it again would not help."""


def _run(work: Callable[[int], None], index: int) -> None:
    """A worker process's body: `work(index)`, its end told by the exit code as a step's is. TensorFlow (imported
    here, after the fork) keeps to one thread a pool: the workers share the cores, and idle pool threads spin."""
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    try:
        work(index)
    except ValueError as error:  # bad input: said in one line, final
        logger.error("%s", error)
        os._exit(exit_codes.BAD_INPUT)
    except BaseException:
        logger.exception("prepare worker %d failed", index)
        os._exit(exit_codes.FAILED)
    os._exit(exit_codes.SUCCESS)


def run_local_workers(count: int, work: Callable[[int], None]) -> None:
    """`work(index)` for every index < `count`, each in a forked process, all at once; each is started again when it
    dies, at most WORKER_ATTEMPTS times. Returns when all have succeeded; raises when one refused or kept dying."""
    context = multiprocessing.get_context("fork")

    def start(index: int):
        process = context.Process(target=_run, args=(work, index), name=f"prepare-worker-{index}")
        process.start()
        return process

    running = {index: start(index) for index in range(count)}
    attempts = dict.fromkeys(range(count), 1)
    try:
        while running:
            time.sleep(POLL_SECONDS)
            for index, process in list(running.items()):
                if process.exitcode is None:
                    continue
                code = process.exitcode
                del running[index]
                if code == exit_codes.SUCCESS:
                    continue
                named = f"prepare worker {index} of {count}"
                if code == exit_codes.BAD_INPUT:
                    raise WorkerRefusedError(f"{named} refused the source or a setting (its error above)")
                how = f"was killed by signal {-code}" if code < 0 else f"failed (exit {code})"
                if attempts[index] >= WORKER_ATTEMPTS:
                    raise RuntimeError(f"{named} {how}, {attempts[index]} times; giving up")
                attempts[index] += 1
                logger.warning("%s %s; starting it again (attempt %d of %d)", named, how, attempts[index],
                               WORKER_ATTEMPTS)  # fmt: skip
                running[index] = start(index)
    finally:
        for process in running.values():  # this run failed or was stopped: its other workers end with it
            process.kill()
            process.join()
    logger.info("the %d prepare workers are done", count)
