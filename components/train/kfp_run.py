"""What the train KFP components run: their parameters -> a TrainConfig -> training -> the artifacts' contents.

No TensorFlow here: the TFJob launcher imports this."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from components.common import exit_codes, storage
from components.common.kfp_parameters import config_from_parameters
from components.common.model_directory import TRAIN_METRICS, artifact_location, pipeline_model_directory
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)


def train_config(dataset: Any, model: Any, launcher: str, **parameters: Any) -> TrainConfig:
    """The TrainConfig a component's parameters describe. `options` may set any other field, but not one that a
    named parameter sets (that would silently override it)."""
    options = dict(parameters.pop("options") or {})
    run_id = parameters.pop("run_id", "")
    explicit_model_dir = parameters.pop("model_dir") or None
    overlap = sorted(set(options) & (set(parameters) | {"data", "model_dir", "launcher"}))
    if overlap:
        raise ValueError(f"options: {overlap} are parameters of the step; set them there, not in options")
    shared = launcher == "tfjob"
    values = {
        **parameters,
        "data": artifact_location(dataset, shared=shared),
        "model_dir": pipeline_model_directory(model, run_id, explicit_model_dir, shared=shared),
        "launcher": launcher,
        **options,
    }
    if run_id and shared:
        from components.train.launch_tfjob import job_name_for_run

        values["tfjob_name"] = job_name_for_run(run_id)
    return config_from_parameters(TrainConfig, values, "train component parameters")


def run_train(dataset: Any, model: Any, ui_metadata: Any, launcher: str, **parameters: Any) -> dict:
    config = train_config(dataset, model, launcher, **parameters)
    from components.train.launcher import run

    code = run(config)
    if code == exit_codes.PREEMPTED:
        sys.exit(exit_codes.PREEMPTED)  # retryable: the step's retry resumes from the saved checkpoint
    if code != 0:
        raise RuntimeError(f"training failed with exit code {code}; see the log above")
    summary = json.loads(storage.read_bytes(storage.join(config.model_dir, TRAIN_METRICS)))
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
    write_tensorboard_metadata(ui_metadata, config.model_dir)
    logger.info("model directory: %s", config.model_dir)
    return summary


def write_tensorboard_metadata(artifact: Any, log_dir: str) -> None:
    """The KFP UI shows a "Start TensorBoard" button for an output artifact named mlpipeline-ui-metadata."""
    with open(artifact.path, "w") as handle:
        json.dump({"outputs": [{"type": "tensorboard", "source": log_dir}]}, handle)
