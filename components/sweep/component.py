"""The sweep KFP component (a lightweight Python component over the project's functions)."""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("launcher"), install_kfp_package=False)
def sweep_component(
    dataset: dsl.Input[dsl.Dataset],
    sweep: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.HTML],
    metrics: dsl.Output[dsl.Metrics],
    space: dict,
    trials: int = 12,
    max_minutes: float = 0.0,
    sampler: str = "tpe",
    pruner: str = "median",
    startup_trials: int = 4,
    parallelism: int = 1,
    repeats: int = 1,
    seed: int = 0,
    train_options: dict = {},  # noqa: B006 (KFP parameters take literal defaults)
    preset: str = "",  # the training step's named settings ("" and -1: not given), under the trial's own
    depth: int = 20,
    batch_size: int = 128,
    epochs: float = -1.0,
    train_steps: int = -1,
    learning_rate: float = 0.1,
    launcher: str = "auto",
    workers: int = 1,
    gpus_per_worker: int = 0,  # the launch settings' defaults, as the training step's (LaunchConfig's)
    worker_cpu: str = "4",
    worker_memory: str = "16Gi",
    worker_image: str = "",
    queue_name: str = "",
    object_store_secret: str = "mlpipeline-minio-artifact",
    sweep_dir: str = "",
    run_id: str = "",
) -> dict:
    """Search train settings over `space` (e.g. {"learning_rate": {"low": 0.01, "high": 0.3, "log": true}}): an Optuna
    study whose trials the train stage trains on the dataset's training split and measures on its validation split
    (never the test split), up to `parallelism` at once (TrainJobs or TFJobs on a cluster, their workers as the
    training step's: `gpus_per_worker`, `worker_cpu`, `worker_memory`, `worker_image`, `queue_name`,
    `object_store_secret`), pruning those behind. `sweep` is the sweep's folder (trials.jsonl, best.json, the study:
    a retried step continues it; `sweep_dir` names another, an earlier run's whose study this one continues),
    `report` its HTML report, `metrics` the best validation accuracy. `launcher` as the training step's (auto: on a
    cluster the job kind it serves, one job per trial; pod: in this step's pod). Every trial trains with
    `train_options` and the named settings (`preset`, `depth`, `batch_size`, `epochs` or `train_steps`,
    `learning_rate`) under its own. Returns the train options of the final training: `train_options`, the best
    trial's settings, and train_on train+validation."""
    from components.common.cli import component_errors
    from components.sweep.kfp_run import EXPECTED_ERRORS, run_sweep

    with component_errors("sweep", EXPECTED_ERRORS):
        return run_sweep(
            dataset, sweep, report, metrics, space=space, run_id=run_id, sweep_dir=sweep_dir,
            launch_options=dict(
                gpus_per_worker=gpus_per_worker, worker_cpu=worker_cpu, worker_memory=worker_memory,
                worker_image=worker_image, queue_name=queue_name, object_store_secret=object_store_secret,
            ),
            trials=trials, max_minutes=max_minutes, sampler=sampler, pruner=pruner, startup_trials=startup_trials,
            parallelism=parallelism, repeats=repeats, seed=seed, train_options=train_options, launcher=launcher,
            named=dict(preset=preset, depth=depth, batch_size=batch_size, epochs=epochs, train_steps=train_steps,
                       learning_rate=learning_rate),
            workers=workers,
        )  # fmt: skip
