"""The train KFP component: a lightweight Python component whose image holds this project.

It trains in-process (one worker), with local worker processes, or by launching a TFJob (`launcher`).
With a TFJob the workers are separate pods, so the model directory must be shared: the `Model`
artifact's gs:// URI on a cluster (or `model_dir`).
"""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("train"), install_kfp_package=False)
def train_component(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    model_dir: str = "",
    workers: int = 1,
    launcher: str = "auto",
    gpus_per_worker: int = 0,
    depth: int = 20,
    batch_size: int = 128,
    train_steps: int = 0,
    epochs: float = 0.0,
    learning_rate: float = 0.1,
    warm_start: str = "",
    options: dict = {},  # noqa: B006 (KFP parameters take literal defaults; never mutated)
    run_id: str = "",
):
    """Train on `dataset`; `model` records where the checkpoints are, the final step and metrics.

    train_steps 0 and epochs 0 mean the stage's default length; `options` sets any other field of
    TrainConfig (e.g. {"optimizer": "adamw", "ema_decay": 0.999}). `run_id` (the pipeline run's ID) names the
    TFJob, so a retried step follows the job its earlier attempt started instead of starting another.
    """
    from components.common.logs import setup_logging
    from components.train.component_support import run_train

    setup_logging()
    run_train(
        dataset,
        model,
        model_dir=model_dir,
        workers=workers,
        launcher=launcher,
        gpus_per_worker=gpus_per_worker,
        depth=depth,
        batch_size=batch_size,
        train_steps=train_steps,
        epochs=epochs,
        learning_rate=learning_rate,
        warm_start=warm_start,
        options=options,
        run_id=run_id,
    )
