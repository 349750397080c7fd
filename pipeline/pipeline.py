"""The pipelines' command line: compile, local-run, run, schedule, schedules, clean-runs, tensorboard.

    python -m pipeline.pipeline compile                         # pipeline/pipeline.yaml, sweep.yaml, predict.yaml
    python -m pipeline.pipeline local-run --source synthetic --train-steps 200
    python -m pipeline.pipeline run --host $KFP_HOST --source s3://bucket/cifar-10-python.tar.gz ...
    python -m pipeline.pipeline schedule --host $KFP_HOST --cron "0 0 3 * * *" ...
    python -m pipeline.pipeline sweep local-run --space space.yaml --trials 8     # the sweep pipeline's commands
    python -m pipeline.pipeline predict run --host $KFP_HOST --model ... --images ...  # the predict pipeline's

This module only chooses the pipeline and hands the rest to pipeline/commands.py: the pipelines' definitions
(training_pipeline.py, sweep_pipeline.py, predict_pipeline.py) never import it, so imports run one way.
"""

from __future__ import annotations

import sys

PIPELINES = ("sweep", "predict")  # the first word that chooses another pipeline than the training one


def pipeline_named(word: str | None):
    """The pipeline a first word chooses: `sweep`, `predict`, or (anything else) the training pipeline."""
    if word == "sweep":
        from pipeline.sweep_pipeline import cifar10_sweep

        return cifar10_sweep
    if word == "predict":
        from pipeline.predict_pipeline import predict_pipeline

        return predict_pipeline
    from pipeline.training_pipeline import cifar10_pipeline

    return cifar10_pipeline


def main(argv: list[str] | None = None) -> int:
    from components import images
    from components.common.exit_codes import BAD_INPUT

    try:  # the images the pipelines name (REGISTRY, TAG), before the pipelines' definitions name them on import
        images.image_of_kind("cpu")
    except ValueError as error:
        print(f"python -m pipeline.pipeline: {error}", file=sys.stderr)
        return BAD_INPUT
    from pipeline.commands import main as run_command

    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] and arguments[0] in PIPELINES:
        return run_command(pipeline_named(arguments[0]), arguments[1:])
    return run_command(pipeline_named(None), arguments)


if __name__ == "__main__":
    sys.exit(main())
