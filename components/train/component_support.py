"""What the train KFP component does with its artifacts."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.config import config_from_mapping
from components.train.__main__ import run
from components.train.config import EXIT_PREEMPTED, TrainConfig
from components.train.launch_tfjob import job_name_for_run
from components.train.loop import TRAIN_METRICS

logger = logging.getLogger(__name__)


def artifact_location(artifact: Any) -> str:
    """Where workers can reach an artifact: its gs:// URI on a cluster, its local path otherwise."""
    return artifact.uri if storage.is_gcs_uri(artifact.uri or "") else artifact.path


def train_config(dataset: Any, model: Any, **parameters: Any) -> TrainConfig:
    options = dict(parameters.pop("options") or {})
    run_id = parameters.pop("run_id", "")
    values = {
        "data": artifact_location(dataset),
        "model_dir": parameters.pop("model_dir") or artifact_location(model),
        "workers": parameters.pop("workers"),
        "launcher": parameters.pop("launcher"),
        "gpus_per_worker": parameters.pop("gpus_per_worker"),
        "depth": parameters.pop("depth"),
        "batch_size": parameters.pop("batch_size"),
        "learning_rate": parameters.pop("learning_rate"),
        "warm_start": parameters.pop("warm_start") or None,
        "train_steps": parameters.pop("train_steps") or None,
        "epochs": parameters.pop("epochs") or None,
    }
    if parameters:
        raise ValueError(f"unknown train parameters {sorted(parameters)}")
    if run_id:
        values["tfjob_name"] = job_name_for_run(run_id)
    values.update(options)
    return config_from_mapping(TrainConfig, values, "train component parameters")


def run_train(dataset: Any, model: Any, **parameters: Any) -> dict:
    config = train_config(dataset, model, **parameters)
    code = run(config)
    if code == EXIT_PREEMPTED:
        sys.exit(EXIT_PREEMPTED)  # retryable: the step's retry resumes from the saved checkpoint
    if code != 0:
        raise RuntimeError(f"training failed with exit code {code}; see the log above")
    metrics_path = storage.join(config.model_dir, TRAIN_METRICS)
    summary = json.loads(storage.read_bytes(metrics_path))
    model.metadata.update(
        {
            "model_dir": config.model_dir,
            "checkpoint": summary["checkpoint"],
            "step": summary["step"],
            "metrics": summary["metrics"],
            "weights_sha256": summary["weights_sha256"],
            "dataset_manifest_sha256": dataset.metadata.get("manifest_sha256", ""),
            "depth": config.depth,
            "workers": config.workers,
        }
    )
    if not storage.is_gcs_uri(config.model_dir) and Path(config.model_dir) != Path(model.path):
        logger.info("checkpoints are in %s (not in the artifact's own folder)", config.model_dir)
    return summary
