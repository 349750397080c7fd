"""python -m components.train --data DATASET_DIR_OR_URI --model-dir DIR_OR_URI [options]"""

from __future__ import annotations

import sys

from components.common.cli import run_stage
from components.common.model_directory import CheckpointError
from components.train.config import TrainConfig
from components.train.launcher import run

DESCRIPTION = "Train a ResNet on a prepared CIFAR-10 dataset, on one worker or many (synchronous all-reduce)."


def main(argv: list[str] | None = None) -> int:
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
