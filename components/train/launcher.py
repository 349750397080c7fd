"""Choosing how training runs: in this process, as local worker processes, as a TFJob, or as one TFJob worker.

auto: TF_CONFIG set -> this process is one worker; workers == 1 -> in-process; otherwise local processes.
"""

from __future__ import annotations

import logging
import os

from components.train.config import EXIT_PREEMPTED, TrainConfig

logger = logging.getLogger(__name__)

EXIT_FAILED = 1  # final for the TFJob ExitCode policy: a NaN or a failed job is not retried


def choose_launcher(config: TrainConfig) -> str:
    if config.launcher != "auto":
        return config.launcher
    if os.environ.get("TF_CONFIG", "").strip():
        return "worker"
    return "inprocess" if config.workers == 1 else "local"


def run(config: TrainConfig) -> int:
    """Train as `config` says; the exit code (0 done, 1 failed for good, 143 preempted: a retry resumes)."""
    launcher = choose_launcher(config)
    if launcher == "local":
        from components.train.launch_local import launch_local

        return launch_local(config)
    if launcher == "tfjob":
        from components.train.launch_tfjob import Cancelled, TFJobError, launch_tfjob

        try:
            return launch_tfjob(config)
        except TFJobError as error:
            logger.error("%s", error)
            return EXIT_FAILED
        except Cancelled:
            return EXIT_PREEMPTED
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
        logger.warning("%s: exiting with %d so that a retry resumes", stopped, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    except (NumericsError, PeersMissingError) as error:
        logger.error("%s", error)
        return EXIT_FAILED
    return EXIT_PREEMPTED if result.preempted else 0
