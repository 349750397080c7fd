"""python -m components.train --data DATASET_DIR_OR_GS_URI --model-dir DIR_OR_GS_URI [options]"""

from __future__ import annotations

import logging
import os
import sys

from components.common.cli import run_stage
from components.train.config import EXIT_PREEMPTED, TrainConfig

logger = logging.getLogger("components.train")
DESCRIPTION = "Train a ResNet on a prepared CIFAR-10 dataset, on one worker or many (synchronous all-reduce)."
EXIT_FAILED = 1  # final for the TFJob ExitCode policy: a NaN or a failed job is not retried


def choose_launcher(config: TrainConfig) -> str:
    if config.launcher != "auto":
        return config.launcher
    if os.environ.get("TF_CONFIG", "").strip():
        return "worker"
    return "inprocess" if config.workers == 1 else "local"


def run(config: TrainConfig) -> int:
    launcher = choose_launcher(config)
    if launcher == "local":
        from components.train.launch_local import launch_local

        return launch_local(config)
    if launcher == "tfjob":
        from components.train.launch_tfjob import TFJobError, launch_tfjob

        try:
            return launch_tfjob(config)
        except TFJobError as error:
            logger.error("%s", error)
            return EXIT_FAILED
    from components.train.loop import NumericsError, train

    try:
        result = train(config)
    except NumericsError as error:
        logger.error("%s", error)
        return EXIT_FAILED
    return EXIT_PREEMPTED if result.preempted else 0


def main(argv: list[str] | None = None) -> int:
    from components.train.checkpoints import CheckpointError

    return run_stage(
        TrainConfig,
        run,
        argv,
        DESCRIPTION,
        "python -m components.train",
        expected_errors=(ValueError, CheckpointError),
    )


if __name__ == "__main__":
    sys.exit(main())
