"""The train KFP components: lightweight Python components whose images hold this project.

- `train_component` trains in its own pod: in-process (one worker) or with local worker processes.
- `launch_training_job_component` starts the workers as a Kubernetes job (a Kubeflow Trainer v2 TrainJob, or a
  training-operator TFJob) and follows it; it needs no GPU and no TensorFlow, so it runs in a small pod. The workers
  run `worker_image` (the pipeline passes the train image it was compiled with).
- `delete_training_job_component` is the pipeline's exit handler: no job outlives its run.

Defaults are literals, because KFP runs a lightweight component's source alone, with nothing of this module defined;
they are the TrainConfig defaults (`components.common.kfp_parameters`: -1 and "" mean not given), which a test checks.

Both write into a model directory that outlives the pod (see `components.common.model_directory`), record it in
their `model` artifact (with the training's metrics and config), output `mlpipeline_ui_metadata`, which gives the
run page a TensorBoard button where KFP's viewer can read the logs, and `tensorboard`, a Markdown note of how to open
them.
"""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("train"), install_kfp_package=False)
def train_component(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    mlpipeline_ui_metadata: dsl.Output[dsl.Artifact],
    tensorboard: dsl.Output[dsl.Markdown],
    model_dir: str = "",
    preset: str = "",
    workers: int = 1,
    depth: int = 20,
    batch_size: int = 128,
    train_steps: int = -1,
    epochs: float = -1.0,
    learning_rate: float = 0.1,
    warm_start: str = "",
    options: dict = {},  # noqa: B006 (KFP parameters take literal defaults; never mutated)
    run_id: str = "",
):
    """Train on `dataset` in this pod (`workers` local processes); `model` records where the checkpoints are, the
    final step and metrics. `preset` ("fast", "airbench94", "airbench94_muon", "cifar10_speedrun", "estimator")
    supplies every value left at its default (see TrainConfig.preset); train_steps -1 and epochs -1 mean the stage's
    (or the preset's) length; `options` sets any other field of TrainConfig (e.g. {"optimizer": "adamw",
    "ema_decay": 0.999}). `run_id` (the pipeline run's ID) keeps the model directory the same for every attempt of
    the step, so a retry resumes from its checkpoints."""
    parameters = dict(locals())  # every parameter above, passed on by name
    from components.common.cli import component_errors
    from components.train.kfp_run import EXPECTED_ERRORS, run_train

    with component_errors("train", EXPECTED_ERRORS):
        run_train(launcher="pod", **parameters)


@dsl.component(base_image=image("launcher"), install_kfp_package=False)
def launch_training_job_component(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    mlpipeline_ui_metadata: dsl.Output[dsl.Artifact],
    tensorboard: dsl.Output[dsl.Markdown],
    launcher: str = "auto",
    model_dir: str = "",
    preset: str = "",
    workers: int = 2,
    gpus_per_worker: int = 0,
    worker_cpu: str = "4",
    worker_memory: str = "16Gi",
    worker_image: str = "",
    object_store_secret: str = "mlpipeline-minio-artifact",
    image_pull_secret: str = "",
    queue_name: str = "",
    depth: int = 20,
    batch_size: int = 128,
    train_steps: int = -1,
    epochs: float = -1.0,
    learning_rate: float = 0.1,
    warm_start: str = "",
    options: dict = {},  # noqa: B006 (KFP parameters take literal defaults; never mutated)
    run_id: str = "",
):
    """Train on `dataset` as a Kubernetes job of `workers` pods (each `worker_cpu`, `worker_memory`,
    `gpus_per_worker`) in this pod's namespace: `launcher` "trainjob" (Kubeflow Trainer v2, Kubeflow 1.11 and later),
    "tfjob" (training-operator v1, Kubeflow 1.10 and older) or "auto" (whichever the cluster serves; outside a cluster,
    local worker processes). The dataset and model directory must be in an object store every worker reaches (KFP's
    default store or a gs:// / s3:// pipeline root). `run_id` names the job, so a retried step follows the job its
    earlier attempt started instead of starting another. worker_image "" is the train image of this release; the
    pipeline passes the one it was compiled with. `image_pull_secret` and `queue_name` (Kueue) are optional."""
    parameters = dict(locals())  # every parameter above, passed on by name
    from components.common.cli import component_errors
    from components.train.kfp_run import EXPECTED_ERRORS, run_train

    with component_errors("train", EXPECTED_ERRORS):
        run_train(**parameters)


@dsl.component(base_image=image("launcher"), install_kfp_package=False)
def delete_training_job_component(run_id: str):
    """The pipeline's exit handler: when the run ends, however it ends, delete its training job if a launching step
    died (out of memory, node lost, retries exhausted) without deleting it. Nothing to do outside a cluster. (It reads
    no PipelineTaskFinalStatus: KFP backends before 2.14 refuse a run whose exit task does.)"""
    from components.common.cli import component_errors
    from components.train.kfp_run import EXPECTED_ERRORS, delete_run_jobs

    with component_errors("train", EXPECTED_ERRORS):
        delete_run_jobs(run_id)
