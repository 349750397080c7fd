"""What the train KFP components run: their parameters -> a TrainConfig (and a LaunchConfig) -> training -> the
artifacts' contents.

No TensorFlow here: the job-launching step imports this."""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
from typing import Any

from components.common import exit_codes, filesystem, outputs, storage
from components.common.kfp_parameters import config_from_parameters
from components.common.model_directory import (
    RESOLVED_CONFIG,
    TRAIN_METRICS,
    TRAIN_METRICS_SCHEMA,
    CheckpointError,
    artifact_location,
    pipeline_model_directory,
)
from components.common.writer_claim import WriterClaimError
from components.train.config import CLUSTER_LAUNCHERS, TrainConfig
from components.train.launch_config import LaunchConfig

# What ends the stage with one line and exit 2 (bad input, final), not a traceback; also its command line's.
EXPECTED_ERRORS = (ValueError, CheckpointError, WriterClaimError)

logger = logging.getLogger(__name__)

# Component parameters that configure the launch, not the training (LaunchConfig's fields; image_pull_secret is
# one name, or "", where the config takes a list).
SEARCHED = "chosen_by_search"  # in a train step's options: they come from a sweep, and override named parameters
LAUNCH_PARAMETERS = ("gpus_per_worker", "worker_cpu", "worker_memory", "worker_image", "object_store_secret")
LAUNCH_PARAMETERS += ("image_pull_secret", "queue_name")


def resolve_launcher(launcher: str, workers: int) -> str:
    """The launcher a component's choice means here. `pod`: train in this pod (in-process, or local worker
    processes); `auto`: on a cluster the job kind it serves, elsewhere (kfp.local) as the CLI's auto does."""
    from components.train.cluster_job import in_kubernetes_pod

    if launcher == "pod":
        return "inprocess" if workers == 1 else "local"
    if launcher == "auto" and in_kubernetes_pod():
        from components.train.launcher import cluster_job_kind

        return cluster_job_kind()
    return launcher


def launch_options(options: dict) -> dict:
    """Take out of `options` those that set the launch (LaunchConfig's fields that are not parameters of their own:
    the workers' `termination_grace_seconds`, `service_account`, `job_timeout_seconds`, ...)."""
    fields = {field.name for field in dataclasses.fields(LaunchConfig)}
    fields -= {*LAUNCH_PARAMETERS, "image_pull_secrets", "job_name"}  # named parameters; the run's own job name
    return {name: options.pop(name) for name in sorted(set(options) & fields)}


def training_configs(dataset: Any, model: Any, launcher: str, **parameters: Any) -> tuple[TrainConfig, LaunchConfig]:
    """The TrainConfig and LaunchConfig a component's parameters describe. `options` may set any other field of
    TrainConfig or LaunchConfig, but not one that a named parameter sets (that would silently override it)."""
    options = dict(parameters.pop("options") or {})
    # The sweep pipeline's options (the best trial's settings) win over the named parameters they repeat, on purpose.
    searched = bool(options.pop(SEARCHED, False))
    run_id = parameters.pop("run_id", "")
    explicit_model_dir = parameters.pop("model_dir") or None
    launch_values = {name: parameters.pop(name) for name in LAUNCH_PARAMETERS if name in parameters}
    launch_values.update(launch_options(options))
    if searched:
        for name in sorted(set(options) & set(parameters)):
            logger.info("%s: %s, as the search chose (not the parameter's %s)", name, options[name], parameters[name])
            parameters.pop(name)
    overlap = sorted(set(options) & (set(parameters) | set(launch_values) | {"data", "model_dir", "launcher"}))
    if overlap:
        raise ValueError(f"options: {overlap} are parameters of the step; set them there, not in options")
    secret = launch_values.pop("image_pull_secret", "")
    launch_values["image_pull_secrets"] = (secret,) if secret else ()
    launcher = resolve_launcher(launcher, int(parameters.get("workers", 1)))
    shared = launcher in CLUSTER_LAUNCHERS
    values = {
        **parameters,
        "data": artifact_location(dataset, shared=shared),
        "model_dir": pipeline_model_directory(model, run_id, explicit_model_dir, shared=shared),
        "launcher": launcher,
        **options,
    }
    if run_id and shared:
        from components.train.cluster_job import job_name_for_run

        launch_values["job_name"] = job_name_for_run(run_id)
    train = config_from_parameters(TrainConfig, values, "train component parameters")
    launch = config_from_parameters(LaunchConfig, launch_values, "train component parameters")
    return train, launch


def run_train(
    dataset: Any, model: Any, mlpipeline_ui_metadata: Any, tensorboard: Any, launcher: str, **parameters: Any
) -> dict:
    train, launch = training_configs(dataset, model, launcher, **parameters)
    from components.train.launcher import run

    code = run(train, launch)
    if code != exit_codes.SUCCESS:  # the reason was logged; 143 and 144 are retryable: a retry resumes
        sys.exit(code)
    location = filesystem.join(train.model_dir, TRAIN_METRICS)
    summary = storage.document(location, TRAIN_METRICS_SCHEMA, f"model directory's {TRAIN_METRICS}")
    write_model_artifact(model, train.model_dir)
    model.metadata.update(
        {
            "framework": summary.get("framework", "tensorflow"),
            "framework_version": summary.get("framework_version", ""),
            "model_dir": train.model_dir,
            "checkpoint": summary["checkpoint"],
            "step": summary["step"],
            "metrics": summary["metrics"],
            "weights_sha256": summary["weights_sha256"],
            "dataset_manifest_sha256": dataset.metadata.get("manifest_sha256", ""),
            "depth": train.depth,
            "workers": train.workers,
        }
    )
    write_tensorboard_metadata(mlpipeline_ui_metadata, tensorboard, train.model_dir)
    logger.info("model directory: %s", train.model_dir)
    return summary


MODEL_ARTIFACT_FILES = (TRAIN_METRICS, RESOLVED_CONFIG)
MODEL_DIRECTORY_NOTE = "model_directory.txt"


def write_model_artifact(model: Any, model_dir: str) -> None:
    """What the KFP UI's lineage and download show of the train step's `model`: the training's metrics and resolved
    config, and where the model directory (checkpoints, summaries) is. Locally the model directory is the artifact's
    own folder and holds them already; on a cluster it stays in the run's folder of the store, which every attempt
    of the step shares, and the artifact gets copies."""
    artifact = os.path.abspath(model.path)
    if filesystem.is_remote(model_dir) or os.path.abspath(model_dir) != artifact:
        os.makedirs(artifact, exist_ok=True)
        for name in MODEL_ARTIFACT_FILES:
            filesystem.atomic_write_bytes(
                os.path.join(artifact, name), storage.read_bytes(filesystem.join(model_dir, name))
            )
        filesystem.atomic_write_bytes(os.path.join(artifact, MODEL_DIRECTORY_NOTE), f"{model_dir}\n".encode())


# Set in the object-store ConfigMap once the admin gave KFP's TensorBoard viewer the store's settings.
VIEWER_READS_S3 = "CIFAR10_PIPELINE_VIEWER_READS_S3"


def tensorboard_outputs(log_dir: str) -> list[dict]:
    """The run page's TensorBoard button, where KFP's viewer can read the logs. Its "Start TensorBoard" button
    starts a viewer pod (tensorflow/tensorflow:2.2.2) with no S3 settings, so on an S3 store it shows an empty board
    (kubeflow/pipelines#5426): the button only for gs:// (or s3:// once the admin gave the viewer the store's
    settings); `tensorboard_note` says how to open the logs otherwise."""
    viewer_reads_s3 = os.environ.get(VIEWER_READS_S3, "").strip().lower() in ("1", "true", "yes")
    if filesystem.is_gcs_uri(log_dir) or (filesystem.is_s3_uri(log_dir) and viewer_reads_s3):
        return [{"type": "tensorboard", "source": log_dir}]
    return []


def tensorboard_note(log_dir: str) -> str:
    """How to open the training logs, as Markdown (the train step's `tensorboard` output)."""
    lines = ["# TensorBoard", "", f"The training's logs: `{log_dir}`", ""]
    if tensorboard_outputs(log_dir):
        lines.append("- on the run's page: **Start TensorBoard** (the step's visualization)")
    if filesystem.is_s3_uri(log_dir):
        lines.append(
            "- in the cluster: the project's TensorBoard (manifests/tensorboard.yaml) reads the store with your "
            "profile's keys: `kubectl port-forward svc/cifar10-pipeline-tensorboard 6006:80`, then http://localhost:6006"
        )
    lines.append(f"- on your own machine: `make tensorboard LOGDIR={shlex.quote(log_dir)}`")
    return "\n".join(lines) + "\n"


def write_tensorboard_metadata(ui_metadata: Any, note: Any, log_dir: str) -> None:
    """The KFP UI reads an output artifact named mlpipeline-ui-metadata (the TensorBoard button) and shows a
    Markdown artifact as it is."""
    outputs.write_json(ui_metadata.path, {"outputs": tensorboard_outputs(log_dir)}, "KFP UI metadata artifact")
    outputs.write_text(note.path, tensorboard_note(log_dir), "TensorBoard note artifact")


def delete_run_jobs(run_id: str) -> list[str]:
    """The pipeline's exit handler: delete the training job of this run (TrainJob or TFJob, whichever the cluster
    serves) if a launching step died without deleting it. Nothing to do outside a cluster; returns what it deleted."""
    from components.train.cluster_job import (
        ClusterJobLauncher,
        in_kubernetes_pod,
        job_name_for_run,
        kubernetes_apis,
        own_namespace,
    )
    from components.train.launch_tfjob import TFJobKind
    from components.train.launch_trainjob import TrainJobKind
    from components.train.launcher import served_job_kinds

    if not in_kubernetes_pod():
        logger.info("not on a Kubernetes cluster: no training job to clean up")
        return []
    custom, core = kubernetes_apis()
    name, namespace = job_name_for_run(run_id), own_namespace()
    deleted = []
    for kind_name in served_job_kinds(custom):
        kind = TrainJobKind() if kind_name == "trainjob" else TFJobKind()
        launcher = ClusterJobLauncher(kind, custom, core)
        if launcher.get(name, namespace) is not None:
            logger.warning("%s is still there after the run: deleting it", launcher.describe(namespace, name))
            launcher.delete(name, namespace)
            deleted.append(launcher.describe(namespace, name))
    if not deleted:
        logger.info("no training job of this run is left (%s/%s)", namespace, name)
    from kubernetes import client

    from components.train import step_lease

    coordination_api = client.CoordinationV1Api(custom.api_client)
    step_lease.StepLease(coordination_api, namespace, step_lease.lease_name(name), 1, "").release()
    return deleted
