"""python -m components.predict --model MODEL --images IMAGES --output PREDICTIONS.jsonl [options]"""

from __future__ import annotations

import sys

from components.common.cli import run_stage
from components.predict.config import PredictConfig

DESCRIPTION = "Score images with a promoted model: predictions as JSON Lines, a summary and an HTML report."


def run(config: PredictConfig) -> int:
    from components.predict.predict import predict

    predict(config)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(PredictConfig, run, argv, DESCRIPTION, "python -m components.predict")


if __name__ == "__main__":
    sys.exit(main())
