"""The cifar10-pipeline KFP pipeline: wiring only (its command line is pipeline/pipeline.py).

source fingerprint -> prepare_data -> check the data -> (warm start?) -> train (a TrainJob or TFJob, or in the step's
pod) -> evaluate -> if blessed: promote; and, when the run ends however it ends, delete its training job if one is left
"""

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kfp import dsl, kubernetes

from components.common.kfp_parameters import parameter_defaults
from components.evaluate.component import (
    check_data_component,
    evaluate_component,
    promote_component,
    warm_start_component,
)
from components.evaluate.config import EvaluateConfig
from components.images import PUBLISHED_COMPONENT_FILES, image
from components.predict.component import predict_component
from components.prepare_data.component import (
    prepare_data_component,
    prepare_part_component,
    prepare_worker_indices_component,
    source_fingerprint_component,
)
from components.prepare_data.config import PrepareDataConfig, step_memory_quantity
from components.sweep.component import sweep_component
from components.train.component import delete_training_job_component, launch_training_job_component, train_component
from components.train.config import TrainConfig
from components.train.launch_config import LaunchConfig

PIPELINE_NAME = "cifar10-pipeline"
# Every step reads and writes object storage with the standard AWS settings: the endpoint (and region) from this
# ConfigMap (manifests/object-store.yaml), the keys from the secret named by `object_store_secret`. Both optional:
# with a gs:// pipeline root neither is needed.
OBJECT_STORE_CONFIG_MAP = "cifar10-pipeline-object-store"
OBJECT_STORE_SETTINGS = ("AWS_ENDPOINT_URL", "AWS_REGION", "CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER")
OBJECT_STORE_SETTINGS += ("CIFAR10_PIPELINE_VIEWER_READS_S3",)
SECRET_KEYS = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}  # KFP's MinIO secret
GPU = "nvidia.com/gpu"
# The stages' defaults, from their config dataclasses (-1 and "" mean not given: components.common.kfp_parameters).
PREPARE, TRAIN, LAUNCH, EVALUATE = (
    parameter_defaults(config) for config in (PrepareDataConfig, TrainConfig, LaunchConfig, EvaluateConfig)
)
# Training steps end after this long, however stuck (the pod's activeDeadlineSeconds): a week, and for the launching
# step an hour more than the job's own timeout, so that it times out first and deletes its job itself.
TRAIN_STEP_TIMEOUT_SECONDS = 7 * 24 * 3600
LAUNCH_STEP_TIMEOUT_SECONDS = int(LAUNCH.job_timeout_seconds) + 3600
# The prepare step's memory (request and limit) for the stage's default bound on a source (max_source_megabytes)
PREPARE_STEP_MEMORY = step_memory_quantity(PREPARE.max_source_megabytes)


def with_pod_settings(task: dsl.PipelineTask, secret_name, image_pull_secret) -> dsl.PipelineTask:
    """Every step: the object store's settings and keys, and the secret for pulling its image ("" for none: Kubernetes
    warns about an empty name and pulls without one)."""
    kubernetes.use_secret_as_env(task, secret_name=secret_name, secret_key_to_env=SECRET_KEYS, optional=True)
    kubernetes.use_config_map_as_env(
        task, OBJECT_STORE_CONFIG_MAP, {name: name for name in OBJECT_STORE_SETTINGS}, optional=True
    )
    kubernetes.set_image_pull_secrets(task, [image_pull_secret])
    return task


@dsl.pipeline(name="evaluate-and-promote")
def evaluate_and_promote(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Input[dsl.Model],
    accuracy_threshold: float,
    baseline_tolerance: float,
    promotion_root: str,
    serving_version: str,
    object_store_secret: str,
    image_pull_secret: str,
    data_blocking: str,
    model_registry: str,
    registered_model_name: str,
    train_image: str,
):
    """Evaluate the trained model; promote it when blessed and a promotion root is set (and register the promoted
    version when a Model Registry is given)."""
    evaluation = evaluate_component(
        dataset=dataset,
        model=model,
        mode="all",  # every kept checkpoint: the test accuracy's curve over the run, in TensorBoard and the report
        accuracy_threshold=accuracy_threshold,
        baseline_tolerance=baseline_tolerance,
        promotion_root=promotion_root,
        data_blocking=data_blocking,
    )
    evaluation.set_caching_options(False)
    evaluation.set_cpu_request("2").set_memory_request("4Gi")
    with_pod_settings(evaluation, object_store_secret, image_pull_secret)

    blessed = evaluation.outputs["Output"] == True  # noqa: E712 (a KFP condition, not a Python comparison)
    with dsl.If(blessed, name="blessed"), dsl.If(promotion_root != "", name="promotion-configured"):
        promotion = promote_component(
            model=model,
            evaluation=evaluation.outputs["evaluation"],
            dataset=dataset,
            promotion_root=promotion_root,
            serving_version=serving_version,
            model_registry=model_registry,
            registered_model_name=registered_model_name,
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            train_image=train_image,
        )
        # a retry of the same promotion takes over its own claim at once, and finds a version it already made ready
        promotion.set_caching_options(False).set_retry(num_retries=2, backoff_duration="60s", backoff_factor=2.0)
        with_pod_settings(promotion, object_store_secret, image_pull_secret)


# The train step's named parameters, one list: the train component's own (KFP needs its signature spelled out);
# the sub-pipelines below and the pipeline pass exactly these on. A test pins the pipeline's parameters to it.
TRAIN_SIGNATURE = inspect.signature(train_component.python_func).parameters
TRAIN_OUTPUTS = ("model", "mlpipeline_ui_metadata", "tensorboard")
TRAINING = tuple(name for name in TRAIN_SIGNATURE if name not in (*TRAIN_OUTPUTS, "run_id"))
TRAIN_RETRIES = {"num_retries": 2, "backoff_duration": "120s", "backoff_factor": 2.0}


def _train_in_pod(training: dict, cpus, memory, object_store_secret, image_pull_secret) -> dsl.PipelineTask:
    task = train_component(**training, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    # Training must run every time (a schedule retrains on new data), so it never comes from the cache; a retry
    # resumes from the last checkpoint in the run's model directory, e.g. after a preemption (exit 143).
    task.set_caching_options(False).set_retry(**TRAIN_RETRIES)
    task.set_cpu_request(cpus).set_memory_request(memory).set_memory_limit(memory)
    kubernetes.set_timeout(task, TRAIN_STEP_TIMEOUT_SECONDS)
    return with_pod_settings(task, object_store_secret, image_pull_secret)


# The training pod's settings: the sub-pipelines' own inputs, since inside a dsl.If branch the KFP compiler does
# not pass pipeline parameters down to the branch.
POD_SETTINGS = {"cpus": str, "memory": str, "object_store_secret": str, "image_pull_secret": str}


def _training_sub_pipeline(name: str, place: Callable[..., None], **placement: type):
    """A sub-pipeline that trains in its own pod: its inputs are the train component's parameters (TRAINING), the
    pod's settings (POD_SETTINGS) and `placement`, which `place(task, **placement)` applies (GPUs, tolerations)."""
    annotations = {key: value.annotation for key, value in TRAIN_SIGNATURE.items() if key in TRAINING}
    annotations |= POD_SETTINGS | placement
    names = list(annotations)

    def sub_pipeline(*values):  # KFP calls a pipeline function with its inputs in the order of its signature
        arguments = dict(zip(names, values, strict=True))
        task = _train_in_pod({key: arguments[key] for key in TRAINING}, *(arguments[key] for key in POD_SETTINGS))
        place(task, **{key: arguments[key] for key in placement})
        return task.outputs["model"]

    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    sub_pipeline.__signature__ = inspect.Signature(
        [inspect.Parameter(key, parameter, annotation=annotation) for key, annotation in annotations.items()],
        return_annotation=dsl.Model,
    )
    sub_pipeline.__name__ = sub_pipeline.__qualname__ = name.replace("-", "_")
    sub_pipeline.__doc__ = place.__doc__
    return dsl.pipeline(name=name)(sub_pipeline)


def _on_gpus(task: dsl.PipelineTask, gpus) -> None:
    """Train in the step's own pod with `gpus` GPUs (the pod tolerates nvidia.com/gpu taints)."""
    task.set_accelerator_type(GPU).set_accelerator_limit(gpus)
    kubernetes.add_toleration(task, key=GPU, operator="Exists", effect="NoSchedule")


def _on_cpus(task: dsl.PipelineTask) -> None:
    """Train in the step's own pod on CPUs (no GPU request, no GPU toleration)."""


train_on_gpus = _training_sub_pipeline("train-on-gpus", _on_gpus, gpus=int)
train_on_cpus = _training_sub_pipeline("train-on-cpus", _on_cpus)


def _prepare_pod(task: dsl.PipelineTask, p: SimpleNamespace) -> None:
    """A prepare step's pod (the whole dataset, its merge, or a worker's part): retried, with the memory its bound on
    the source needs."""
    task.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2.0)
    task.set_cpu_request("2").set_memory_request(p.prepare_step_memory).set_memory_limit(p.prepare_step_memory)
    # a resource's parameter is not among the task's inputs KFP passes down into the exit handler: name it
    task.register_pipeline_channels([p.prepare_step_memory])
    with_pod_settings(task, p.object_store_secret, p.image_pull_secret)


# Whether the pipelines being defined fan their prepare step out (`with_prepare_fan_out`); False for the compiled
# pipelines under pipeline/, which every backend in docs/cluster.md's table runs (pipeline/backend_support.py).
_prepare_fan_out = False


def with_prepare_fan_out(pipeline):
    """`pipeline` with its prepare step fanned out: a ParallelFor of prepare_workers pods, each converting its share
    of the shards, merged by the prepare step (dsl.Collected: KFP backends from 2.14, pipeline/backend_support.py).
    The same name and parameters; without it, prepare_workers are processes in the one prepare step's pod."""
    global _prepare_fan_out
    _prepare_fan_out = True
    try:
        return dsl.pipeline(name=pipeline.name, description=pipeline.description)(pipeline.pipeline_func)
    finally:
        _prepare_fan_out = False


def _prepare(p: SimpleNamespace):
    """Fingerprint the source, then prepare the dataset (fanned out where the pipeline is `with_prepare_fan_out`):
    the fingerprint and prepare tasks."""
    fingerprint = source_fingerprint_component(source=p.source, launcher=p.launcher, promotion_root=p.promotion_root)
    fingerprint.set_caching_options(False)  # it must look at the source every time; in a pod, it checks access first
    with_pod_settings(fingerprint, p.object_store_secret, p.image_pull_secret)
    preparing = {
        "source": p.source,
        "source_sha256": p.source_sha256,
        "validation_fraction": p.validation_fraction,
        "synthetic_train_per_class": p.synthetic_train_per_class,
        "resize": p.resize,
        "leakage": p.leakage,
        "max_source_megabytes": p.max_source_megabytes,
        "prepare_workers": p.prepare_workers,
    }
    parts = {}
    if _prepare_fan_out:  # each worker its share of the shards, merged by the prepare step; one worker returns at once
        indices = prepare_worker_indices_component(prepare_workers=p.prepare_workers)
        indices.set_caching_options(False).after(fingerprint)
        with_pod_settings(indices, p.object_store_secret, p.image_pull_secret)
        with dsl.ParallelFor(indices.output) as index:  # no name=: KFP 2.15 loses a named loop's outputs
            part = prepare_part_component(index=index, source_fingerprint=fingerprint.output, **preparing)
            _prepare_pod(part, p)  # cached as the prepare step is: keyed on the source's content
        parts = {"parts": dsl.Collected(part.outputs["Output"])}
    data = prepare_data_component(**preparing, source_fingerprint=fingerprint.output, **parts)
    _prepare_pod(data, p)
    return fingerprint, data


def retrain(parameters: dict[str, Any], search: Callable[..., Any] | None = None) -> None:
    """The training pipeline's graph, from its parameters: fingerprint, prepare, check, (search,) train, evaluate,
    promote. `search(dataset, check, parameters)`, when given, returns the train options the training uses (the
    sweep pipeline's best trial's). The preparation comes before the exit handler (which deletes a training job
    left behind): a ParallelFor inside an ExitHandler fails on KFP backends (kubeflow/pipelines #12390)."""
    p = SimpleNamespace(**parameters)
    _fingerprint, data = _prepare(p)
    dataset = data.outputs["dataset"]
    cleanup = delete_training_job_component(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    cleanup.set_caching_options(False)
    kubernetes.set_image_pull_secrets(cleanup, [p.image_pull_secret])
    with dsl.ExitHandler(cleanup, name="run"):
        check = check_data_component(
            dataset=dataset,
            mode=p.data_check,
            reference=p.data_reference,
            promotion_root=p.promotion_root,
            thresholds=p.data_thresholds,
        )
        check.set_caching_options(False)  # the promoted model it compares with changes between runs
        with_pod_settings(check, p.object_store_secret, p.image_pull_secret)

        start = warm_start_component(
            warm_start=p.warm_start, promotion_root=p.promotion_root, from_promoted=p.warm_start_from_promoted
        )
        start.set_caching_options(False).after(data)  # a failed prepare ends the run: nothing else starts
        with_pod_settings(start, p.object_store_secret, p.image_pull_secret)

        # The sweep pipeline: the options of the best trial (trained on all the training data); else the parameter.
        options = p.train_options if search is None else search(dataset, check, parameters)
        # The train step's parameters are the pipeline's of the same name, but for these three.
        named = {"dataset": dataset, "warm_start": start.output, "options": options}
        training = {name: named[name] if name in named else parameters[name] for name in TRAINING}
        gate = {
            "dataset": dataset,
            "accuracy_threshold": p.accuracy_threshold,
            "baseline_tolerance": p.baseline_tolerance,
            "promotion_root": p.promotion_root,
            "serving_version": p.serving_version,
            "object_store_secret": p.object_store_secret,
            "image_pull_secret": p.image_pull_secret,
            "data_blocking": check.outputs["Output"],
            "model_registry": p.model_registry,
            "registered_model_name": p.registered_model_name,
            "train_image": p.worker_image,
        }
        pod_settings = {"object_store_secret": p.object_store_secret, "image_pull_secret": p.image_pull_secret}
        # Exactly one branch runs; each trains, then evaluates and promotes its own model.
        with dsl.If(p.launcher != "pod", name="training-job"):
            launched = launch_training_job_component(
                **training,
                launcher=p.launcher,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,  # names the job: a retried step follows the same job
                gpus_per_worker=p.gpus_per_worker,
                worker_cpu=p.worker_cpu,
                worker_memory=p.worker_memory,
                worker_image=p.worker_image,
                object_store_secret=p.object_store_secret,
                image_pull_secret=p.image_pull_secret,
                queue_name=p.queue_name,
            )
            launched.set_caching_options(False).set_retry(**TRAIN_RETRIES).after(check)  # data_check=fail: no training
            launched.set_cpu_request("250m").set_memory_request("512Mi").set_memory_limit("1Gi")
            kubernetes.set_timeout(launched, LAUNCH_STEP_TIMEOUT_SECONDS)
            kubernetes.use_field_path_as_env(launched, "POD_NAMESPACE", "metadata.namespace")
            with_pod_settings(launched, p.object_store_secret, p.image_pull_secret)
            evaluate_and_promote(model=launched.outputs["model"], **gate).set_caching_options(False)
        with dsl.Elif(p.train_step_gpus > 0, name="gpu-pod"):
            on_gpus = train_on_gpus(
                **training, cpus=p.train_step_cpus, memory=p.train_step_memory, gpus=p.train_step_gpus, **pod_settings
            )
            on_gpus.set_caching_options(False).after(check)
            evaluate_and_promote(model=on_gpus.output, **gate).set_caching_options(False)
        with dsl.Else(name="cpu-pod"):
            on_cpus = train_on_cpus(**training, cpus=p.train_step_cpus, memory=p.train_step_memory, **pod_settings)
            on_cpus.set_caching_options(False).after(check)
            evaluate_and_promote(model=on_cpus.output, **gate).set_caching_options(False)


@dsl.pipeline(name=PIPELINE_NAME, description="CIFAR-10: prepare, train (multi-worker), evaluate, promote.")
def cifar10_pipeline(
    source: str = PREPARE.source,
    source_sha256: str = PREPARE.source_sha256,
    validation_fraction: float = 0.0,  # the pipeline's own choice: train on all 50,000, as published results do
    resize: str = "",
    leakage: str = PREPARE.leakage,
    data_check: str = "warn",  # a schedule's default is "block" (pipeline/commands.py SCHEDULE_DEFAULTS)
    data_reference: str = "",
    data_thresholds: dict = {},  # noqa: B006 (KFP parameters take literal defaults)
    preset: str = "",
    workers: int = 2,  # the pipeline's own choice: it exists to train on several workers
    launcher: str = "auto",
    gpus_per_worker: int = LAUNCH.gpus_per_worker,
    worker_cpu: str = LAUNCH.worker_cpu,
    worker_memory: str = LAUNCH.worker_memory,
    worker_image: str = image("train"),
    image_pull_secret: str = "",
    queue_name: str = LAUNCH.queue_name,
    train_step_gpus: int = 0,
    train_step_cpus: str = LAUNCH.worker_cpu,
    train_step_memory: str = LAUNCH.worker_memory,
    depth: int = TRAIN.depth,
    batch_size: int = TRAIN.batch_size,
    epochs: float = TRAIN.epochs,
    train_steps: int = TRAIN.train_steps,
    learning_rate: float = TRAIN.learning_rate,
    warm_start: str = TRAIN.warm_start,
    warm_start_from_promoted: bool = False,
    train_options: dict = {},  # noqa: B006 (KFP parameters take literal defaults)
    model_dir: str = "",
    accuracy_threshold: float = 0.5,  # the pipeline's own gate; the evaluate stage alone blesses anything
    baseline_tolerance: float = EVALUATE.baseline_tolerance,
    promotion_root: str = "",
    serving_version: str = EVALUATE.serving_version,
    model_registry: str = "",
    registered_model_name: str = EVALUATE.registered_model_name,
    object_store_secret: str = LAUNCH.object_store_secret,
    synthetic_train_per_class: int = PREPARE.synthetic_train_per_class,
    max_source_megabytes: int = PREPARE.max_source_megabytes,
    prepare_step_memory: str = PREPARE_STEP_MEMORY,
    prepare_workers: int = PREPARE.prepare_workers,
):
    """Prepare CIFAR-10, train a ResNet on one or many workers, evaluate it, and promote it when it is good enough.

    Args:
        source: The data: the official archive's URL, a gs:// or s3:// URI, an archive or folder, or "synthetic".
        source_sha256: Expected SHA-256 of the source archive ("" checks only the official archive's known digest).
        validation_fraction: Fraction of the training data held out for validation (its loss and accuracy are then
            curves during training); 0 trains on all of it, -1 keeps the source's own (CIFAR-10's data batch 5).
        resize: HEIGHTxWIDTH (or N): resize every image to it, as Keras's image_dataset_from_directory(image_size)
            does; the model's input size is then that ("": the images' own size, one for all).
        leakage: Test images with a near-duplicate in the training split: "keep" (counted in the dataset's
            statistics; the report shows the accuracy without them too), "drop_from_train" (remove their training
            copies) or "drop_from_eval" (remove them from the evaluation).
        data_check: What a data check error does (the data against the promoted model's, or data_reference): "warn"
            (say it), "block" (no promotion, the decision names the finding; a schedule's default) or "fail" (stop
            the run before training).
        data_reference: The statistics to check the data against: a statistics.json, a promoted version's
            data_statistics.json or a prepared dataset ("": the promoted model's training data).
        data_thresholds: The data check's thresholds by name, e.g. {"channel_mean_shift": 0.5} (components/common/
            data_statistics.py DataCheckConfig).
        preset: A training recipe: "fast" (cifar10_speedrun: the 2025 CIFAR-10 speedrun record's values, 7 epochs),
            "airbench94_muon" (94% on CIFAR-10 in 8 epochs, published), "airbench94" (its predecessor: 94% in 10
            epochs), or "estimator" (the CIFAR-10 estimator example's ResNet recipe); its values apply wherever a
            parameter is left at its default.
        workers: Training workers (synchronous all-reduce): pods of a training job, or local processes in one pod.
        launcher: Where the workers run: "auto" (the job kind the cluster serves: a TrainJob on Kubeflow 1.11 and
            later, a TFJob on 1.10 and older; local processes under kfp.local), "trainjob", "tfjob", or "pod" (local
            processes inside the training step's own pod).
        gpus_per_worker: Training job: GPUs of each worker pod (such pods tolerate nvidia.com/gpu taints).
        worker_cpu: Training job: CPU request of each worker pod.
        worker_memory: Training job: memory request and limit of each worker pod.
        worker_image: Training job: the workers' image (default: the train image this pipeline was compiled with).
        image_pull_secret: The secret for pulling the images from a private registry, for every step and worker ("":
            none).
        queue_name: Training job: the Kueue LocalQueue to submit it to ("": none).
        train_step_gpus: launcher=pod: GPUs of the training step's own pod (KFP backends before 2.4 ignore this).
        train_step_cpus: launcher=pod: CPU request of the training step's pod.
        train_step_memory: launcher=pod: memory request and limit of the training step's pod.
        depth: ResNet depth, 6n+2 (20, 32, 44, 56, 110).
        batch_size: Global batch size, split over all replicas.
        epochs: Epochs to train (-1: use train_steps, or the stage's default of 80000 steps).
        train_steps: Global steps to train (-1: use epochs, or the stage's default).
        learning_rate: Learning rate per 128 images (scaled with the batch size).
        warm_start: A checkpoint (prefix or folder) to start from ("" for none).
        warm_start_from_promoted: Start from the checkpoint of the model promoted under promotion_root, if any.
        train_options: Any other train setting by its name, e.g. {"optimizer": "adamw", "ema_decay": 0.999}.
        model_dir: Where checkpoints and summaries go ("" for a folder of this run in the pipeline's object store).
        accuracy_threshold: The gate: the lowest test accuracy that may be promoted.
        baseline_tolerance: The gate: how far below the promoted model's accuracy a new model may be.
        promotion_root: Where blessed models go (integer version folders, current.json); "" for no promotion.
        serving_version: The TensorFlow Serving release the promotion root is served by (KServe's runtimeVersion): a
            model it cannot load is not promoted ("": what the root declares, if anything).
        model_registry: Kubeflow's Model Registry (its REST address, http(s)://HOST[:PORT]) to register each promoted
            version in, with its lineage; "" for none. A registry that cannot be reached leaves the promotion
            standing (the promote step says so).
        registered_model_name: The registered model the promoted versions are registered under.
        object_store_secret: The secret with the object store's keys (accesskey, secretkey); KFP's by default.
        synthetic_train_per_class: source=synthetic: training images per class.
        max_source_megabytes: The most the source may hold, unpacked and its images decoded, in MB (CIFAR-10 is 180
            MB); a larger one is refused. Raise it with prepare_step_memory, at 8 MB of memory for each MB.
        prepare_step_memory: Memory request and limit of the prepare step's pod (at least 8 MB for each MB of
            max_source_megabytes).
        prepare_workers: Pods the preparation fans out to (a ParallelFor, each converting its share of the shards),
            merged by the prepare step into the same dataset one pod makes; 1 prepares it in one pod.
    """
    retrain(dict(locals()))


# Each stage's components, published as component YAML (compiled by `make compile` from these definitions, kept
# current by a test) for other pipelines to load with kfp.components.load_component_from_file. Their file names are
# components.images.PUBLISHED_COMPONENT_FILES, in this order.
PUBLISHED_COMPONENTS = dict(
    zip(
        PUBLISHED_COMPONENT_FILES,
        (
            prepare_data_component,
            source_fingerprint_component,
            check_data_component,
            train_component,
            launch_training_job_component,
            evaluate_component,
            promote_component,
            warm_start_component,
            predict_component,
            sweep_component,
        ),
        strict=True,
    )
)
