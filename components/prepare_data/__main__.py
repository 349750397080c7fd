"""python -m components.prepare_data --source SOURCE --output DIR_OR_GS_URI [options]"""

from __future__ import annotations

import sys

from components.common.cli import run_stage
from components.common.memory import reuse_freed_memory
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.kfp_run import EXPECTED_ERRORS
from components.prepare_data.prepare import prepare_data

DESCRIPTION = "Convert CIFAR-10 (or images in class folders, or synthetic data) to validated, sharded TFRecords."


def main(argv: list[str] | None = None) -> int:
    reuse_freed_memory()
    return run_stage(
        PrepareDataConfig,
        prepare_data,
        argv,
        DESCRIPTION,
        "python -m components.prepare_data",
        expected_errors=EXPECTED_ERRORS,
    )


if __name__ == "__main__":
    sys.exit(main())
