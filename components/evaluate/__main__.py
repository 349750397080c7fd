"""python -m components.evaluate --data DATASET --model-dir DIR_OR_GS_URI [options]"""

from __future__ import annotations

import sys

from components.common.cli import run_stage
from components.evaluate.config import EvaluateConfig

DESCRIPTION = "Evaluate checkpoints, write metrics and a report, decide whether to promote, and promote."


def run(config: EvaluateConfig) -> int:
    from components.evaluate.evaluate import evaluate

    result = evaluate(config)
    print(result.decision.summary())  # the one line a person or a script looks for
    return 0


def main(argv: list[str] | None = None) -> int:
    from components.evaluate.kfp_run import EXPECTED_ERRORS

    return run_stage(
        EvaluateConfig,
        run,
        argv,
        DESCRIPTION,
        "python -m components.evaluate",
        expected_errors=EXPECTED_ERRORS,
    )


if __name__ == "__main__":
    sys.exit(main())
