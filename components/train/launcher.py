"""Choosing how training runs: in this process, as local worker processes, as a TFJob, or as one TFJob worker.

auto: TF_CONFIG set -> this process is one worker; workers == 1 -> in-process; otherwise local processes.
"""

from __future__ import annotations

import logging
import os
import signal

from components.common import exit_codes
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)


def choose_launcher(config: TrainConfig) -> str:
    if config.launcher != "auto":
        return config.launcher
    if os.environ.get("TF_CONFIG", "").strip():
        return "worker"
    return "inprocess" if config.workers == 1 else "local"


def run(config: TrainConfig) -> int:
    """Train as `config` says; the exit code (0 done, 1 failed for good, 143 preempted: a retry resumes)."""
    launcher = choose_launcher(config)
    if launcher in ("local", "tfjob"):
        # These launch and watch; their own SIGTERM handlers pass the signal on or delete the job. (The block
        # `python -m components.train` starts with is for the processes that train; see termination.py.)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if launcher == "local":
        from components.train.launch_local import launch_local

        return launch_local(config)
    if launcher == "tfjob":
        from components.train.launch_tfjob import Cancelled, TFJobError, launch_tfjob

        try:
            return launch_tfjob(config)
        except TFJobError as error:
            logger.error("%s", error)
            return exit_codes.FAILED
        except Cancelled:
            return exit_codes.PREEMPTED
    from components.train import termination

    termination.block_for_this_process()  # before TensorFlow starts a thread: see termination.py
    if launcher == "worker":
        from components.train.launch_local import die_with_launcher

        die_with_launcher()
    from components.train.distribution import PeersMissingError
    from components.train.loop import NumericsError, train

    try:
        result = train(config)
    except termination.Terminated as stopped:
        logger.warning("%s: exiting with %d so that a retry resumes", stopped, exit_codes.PREEMPTED)
        return exit_codes.PREEMPTED
    except (NumericsError, PeersMissingError) as error:
        logger.error("%s", error)
        return exit_codes.FAILED
    return exit_codes.PREEMPTED if result.preempted else exit_codes.SUCCESS
