"""python -m components.train --data DATASET_DIR_OR_URI --model-dir DIR_OR_URI [options]"""

from __future__ import annotations

import functools
import sys

from components.train import termination

# Before anything can start a thread: every thread then inherits SIGTERM blocked (see termination.py).
termination.block_for_this_process()

from components.common.cli import run_stage  # noqa: E402 (after the signal block above)
from components.train.config import TrainConfig  # noqa: E402
from components.train.kfp_run import EXPECTED_ERRORS  # noqa: E402
from components.train.launch_config import LaunchConfig  # noqa: E402
from components.train.launcher import run  # noqa: E402

DESCRIPTION = (
    "Train a model on a prepared CIFAR-10 dataset, on one worker or many (synchronous all-reduce): in this process, as "
    "local worker processes, or as a Kubernetes job (a Kubeflow Trainer v2 TrainJob or a training-operator TFJob)."
)


def main(argv: list[str] | None = None) -> int:
    return run_stage(
        (TrainConfig, LaunchConfig),
        functools.partial(run, refuse_unused_launch=True),
        argv,
        DESCRIPTION,
        "python -m components.train",
        expected_errors=EXPECTED_ERRORS,
    )


if __name__ == "__main__":
    sys.exit(main())
