"""python -m components.sweep --data DATASET --sweep-dir DIR --space SPACE [--trials N] [options]"""

from __future__ import annotations

import sys

from components.common.cli import run_stage
from components.sweep.config import SweepConfig
from components.sweep.kfp_run import EXPECTED_ERRORS
from components.sweep.sweep import sweep

DESCRIPTION = (
    "Search train settings: an Optuna study whose trials the train stage trains (on the training split, measured on "
    "the validation split), pruning those behind; the sweep's folder holds trials.jsonl, best.json and a report."
)


def main(argv: list[str] | None = None) -> int:
    return run_stage(
        SweepConfig, sweep, argv, DESCRIPTION, "python -m components.sweep",
        expected_errors=EXPECTED_ERRORS,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
