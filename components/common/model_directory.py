"""The model directory: the one place every stage reads and writes a trained model through, and where it lives.

    <model_dir>/config.json            the resolved train config (written by train)
    <model_dir>/train_metrics.json     the final step, metrics and checkpoint (written by train when it ends)
    <model_dir>/ckpt-N.*, checkpoint   checkpoints (train)
    <model_dir>/train/, eval/          TensorBoard summaries (train, evaluate)
    <model_dir>/eval_metrics.json      the evaluation's summary (evaluate)

It is a local folder or a gs:// / s3:// prefix. In a KFP pipeline it is placed so that it outlives the step's
pod (see `pipeline_model_directory`): every TFJob worker and every retried attempt of the step reach it.
This module imports no TensorFlow, so the TFJob launching step can run in a small image.
"""

from __future__ import annotations

from typing import Any

from components.common import storage

RESOLVED_CONFIG = "config.json"
TRAIN_METRICS = "train_metrics.json"
EVAL_METRICS = "eval_metrics.json"
CHECKPOINT_PREFIX = "ckpt"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"
RUN_MODEL_DIRECTORY = "model-directory"  # under `<pipeline root>/<pipeline>/<run id>/`, shared by the run's attempts


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected, or a warm start that matched nothing."""


def artifact_location(artifact: Any, shared: bool = False) -> str:
    """Where to read a KFP input artifact: its pod-local copy, or (`shared`: for other pods) its object-store URI.

    On a cluster the launcher downloads inputs to `artifact.path`, which only this pod sees; other pods (TFJob
    workers) need `artifact.uri` (`minio://...` in KFP's default store, mapped to s3://; or gs://, s3://)."""
    uri = storage.normalize_uri(artifact.uri or "")
    if shared:
        if not storage.is_remote(uri):
            raise ValueError(
                f"{artifact.name or 'artifact'}: {artifact.path} is pod-local ({artifact.uri!r}); the TFJob's workers "
                "run in other pods and cannot read it. Run the pipeline with its default object store (KFP's "
                "MinIO/SeaweedFS) or a pipeline_root on gs:// or s3://"
            )
        return uri
    return artifact.path


def pipeline_model_directory(model_artifact: Any, run_id: str, explicit: str | None, shared: bool) -> str:
    """The train step's model directory in a pipeline run.

    `explicit` wins. Otherwise, when the artifact lives in an object store, a folder of the run itself
    (`<pipeline root>/<pipeline>/<run id>/model-directory`): the artifact's own URI may change from one attempt of
    the step to the next (newer KFP backends salt it per pod), and checkpoints must survive into the retry.
    Otherwise (kfp.local, or no run id) the artifact's own folder. `shared` (a TFJob) requires an object store."""
    if explicit:
        location = storage.normalize_uri(explicit)
    else:
        uri = storage.normalize_uri(model_artifact.uri or "")
        if storage.is_remote(uri):
            marker = f"/{run_id}/" if run_id else None
            location = uri[: uri.index(marker) + len(marker)] + RUN_MODEL_DIRECTORY if marker and marker in uri else uri
        else:
            location = model_artifact.path
    if shared and not storage.is_remote(location):
        raise ValueError(
            f"model_dir: {location} is pod-local; the TFJob's workers run in other pods and cannot write it. Run "
            "the pipeline with its default object store (KFP's MinIO/SeaweedFS) or a pipeline_root on gs:// or "
            "s3://, or give the train step a model_dir on gs:// or s3://"
        )
    return location
