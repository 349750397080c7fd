"""The cifar10-pipeline KFP pipeline: wiring only. Entry points: compile, local-run, run, schedule, tensorboard.

source fingerprint -> prepare_data -> (warm start?) -> train -> evaluate -> if blessed: promote

python -m pipeline.pipeline compile
python -m pipeline.pipeline local-run --source synthetic --train-steps 200
python -m pipeline.pipeline run --host $KFP_HOST --source gs://bucket/cifar-10-python.tar.gz ...
python -m pipeline.pipeline schedule --host $KFP_HOST --cron "0 0 3 * * *" ...
"""

import sys

from kfp import dsl, kubernetes

from components.evaluate.component import evaluate_component, promote_component, warm_start_component
from components.prepare_data.component import prepare_data_component, source_fingerprint_component
from components.prepare_data.config import OFFICIAL_URL
from components.train.component import train_component

PIPELINE_NAME = "cifar10-pipeline"


@dsl.pipeline(name=PIPELINE_NAME, description="CIFAR-10: prepare, train (multi-worker), evaluate, promote.")
def cifar10_pipeline(
    source: str = OFFICIAL_URL,
    source_sha256: str = "",
    validation_fraction: float = -1.0,
    workers: int = 2,
    launcher: str = "auto",
    gpus_per_worker: int = 0,
    train_step_gpus: int = 0,
    train_step_cpus: str = "4",
    train_step_memory: str = "16Gi",
    depth: int = 20,
    batch_size: int = 128,
    epochs: float = 0.0,
    train_steps: int = 0,
    learning_rate: float = 0.1,
    warm_start: str = "",
    warm_start_from_promoted: bool = False,
    train_options: dict = {},  # noqa: B006 (KFP parameters take literal defaults)
    accuracy_threshold: float = 0.5,
    baseline_tolerance: float = 0.0,
    promotion_root: str = "",
    synthetic_train_per_class: int = 200,
):
    """Parameters: the data `source` (URL, gs://, local archive or folder, or "synthetic"); training on
    `workers` workers (`launcher`: auto/local in the step's pod, sized by `train_step_*`, or tfjob with
    `gpus_per_worker` GPUs per worker pod); the
    ResNet `depth`; `epochs` or `train_steps` (0: the stage's default); the gate's `accuracy_threshold` and
    `baseline_tolerance` against the model promoted under `promotion_root` (no promotion when empty)."""
    fingerprint = source_fingerprint_component(source=source).set_display_name("fingerprint the source")
    fingerprint.set_caching_options(False)  # it must look at the source every time

    data = prepare_data_component(
        source=source,
        source_sha256=source_sha256,
        validation_fraction=validation_fraction,
        synthetic_train_per_class=synthetic_train_per_class,
        source_fingerprint=fingerprint.output,
    ).set_display_name("prepare data")
    data.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2.0)
    data.set_cpu_request("2").set_memory_request("8Gi").set_memory_limit("8Gi")

    start = warm_start_component(
        warm_start=warm_start, promotion_root=promotion_root, from_promoted=warm_start_from_promoted
    ).set_display_name("choose the warm start")
    start.set_caching_options(False)

    train = train_component(
        dataset=data.outputs["dataset"],
        workers=workers,
        launcher=launcher,
        gpus_per_worker=gpus_per_worker,
        depth=depth,
        batch_size=batch_size,
        train_steps=train_steps,
        epochs=epochs,
        learning_rate=learning_rate,
        warm_start=start.output,
        options=train_options,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,  # names the TFJob: a retried step follows the same job
    ).set_display_name("train")
    # Training must run every time (a schedule retrains on new data); a cached train step would silently skip
    # it. Retries resume from the last checkpoint, e.g. after a preemption (exit 143).
    train.set_caching_options(False)
    train.set_retry(num_retries=2, backoff_duration="120s", backoff_factor=2.0)
    # With launcher=tfjob the step only launches and watches the job (the workers' pods get gpus_per_worker
    # GPUs each); otherwise the step trains in its own pod, which then needs train_step_gpus GPUs.
    train.set_cpu_request(train_step_cpus).set_memory_request(train_step_memory).set_memory_limit(train_step_memory)
    train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(train_step_gpus)
    kubernetes.add_toleration(train, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    model = train.outputs["model"]

    evaluation = evaluate_component(
        dataset=data.outputs["dataset"],
        model=model,
        accuracy_threshold=accuracy_threshold,
        baseline_tolerance=baseline_tolerance,
        promotion_root=promotion_root,
    ).set_display_name("evaluate")
    evaluation.set_caching_options(False)
    evaluation.set_cpu_request("2").set_memory_request("4Gi")

    blessed = evaluation.outputs["Output"] == True  # noqa: E712 (a KFP condition, not a Python comparison)
    with dsl.If(blessed, name="blessed"), dsl.If(promotion_root != "", name="promotion-configured"):
        promote_component(
            model=model, evaluation=evaluation.outputs["evaluation"], promotion_root=promotion_root
        ).set_display_name("promote").set_caching_options(False)


def main(argv: list[str] | None = None) -> int:
    from pipeline.commands import main as run_command

    return run_command(cifar10_pipeline, argv)


if __name__ == "__main__":
    sys.exit(main())
