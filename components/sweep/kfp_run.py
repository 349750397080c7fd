"""What the sweep KFP component runs: its parameters -> a SweepConfig -> the search -> the best trial's train options,
its report and metrics."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from components.common import exit_codes, filesystem, storage
from components.common.kfp_parameters import config_from_parameters, given_parameters
from components.common.model_directory import artifact_location, pipeline_model_directory
from components.common.writer_claim import WriterClaimError
from components.sweep.config import SweepConfig
from components.sweep.space import SearchSpaceError
from components.sweep.sweep import REPORT, SweepError, read_best, sweep
from components.train.config import TrainConfig
from components.train.kfp_run import SEARCHED, resolve_launcher

logger = logging.getLogger(__name__)

EXPECTED_ERRORS = (ValueError, SearchSpaceError, SweepError, WriterClaimError)
SWEEP_DIRECTORY = "sweep-directory"  # under `<pipeline root>/<pipeline>/<run id>/`: a retried step continues the study


def run_sweep(
    dataset: Any, sweep_artifact: Any, report: Any, metrics: Any, space: dict, launch_options: dict, run_id: str,
    named: dict, sweep_dir: str = "", **options: Any,
) -> dict:  # fmt: skip
    """Search; returns the train options the final training uses: the sweep's own, the best trial's settings, and
    train_on train+validation (the validation split was for choosing; the final model learns from it too)."""
    from components.train.config import CLUSTER_LAUNCHERS

    # The trials' launcher as the training step reads its own: on a cluster, auto is the job kind it serves (a
    # TrainJob or TFJob per trial); pod trains in this step's pod; under kfp.local, local processes.
    options["launcher"] = resolve_launcher(options["launcher"], int(options.get("workers", 1)))
    shared = options["launcher"] in CLUSTER_LAUNCHERS
    sweep_dir = pipeline_model_directory(
        sweep_artifact, run_id, sweep_dir or None, shared=shared, folder=SWEEP_DIRECTORY
    )
    # The training step's named settings (those given) under the train options, as the train step combines them.
    train_options = {**given_parameters(TrainConfig, named), **dict(options.pop("train_options") or {})}
    # the trials' workers as the training step's when they are a cluster job's ("": not given, the launcher's
    # default); trials in this step's pod have no job to set (the object store's secret is this pod's own already)
    job_settings = {k: v for k, v in launch_options.items() if v not in ("", -1)} if shared else {}
    config = config_from_parameters(
        SweepConfig,
        {
            **options,
            "data": artifact_location(dataset, shared=shared),
            "sweep_dir": sweep_dir,
            "space": json.dumps(space),
            "train_options": {**train_options, **job_settings},
        },
        "sweep component parameters",
    )
    code = sweep(config)
    if code != exit_codes.SUCCESS:  # stopped: a retry continues the study
        sys.exit(code)
    best = read_best(sweep_dir)
    filesystem.atomic_write_bytes(report.path, storage.read_bytes(filesystem.join(sweep_dir, REPORT)))
    sweep_artifact.metadata.update({"sweep_dir": sweep_dir, "best_trial": best["trial"], "best_params": best["params"]})
    metrics.log_metric("best_validation_accuracy", best["validation_accuracy"])
    if best.get("validation_accuracy_std") is not None:
        metrics.log_metric("best_validation_accuracy_std", best["validation_accuracy_std"])
    chosen = {**train_options, **best["params"], "train_on": "train+validation", SEARCHED: True}
    logger.info("best trial %d (validation accuracy %.4f): the final training uses %s", best["trial"],
                best["validation_accuracy"], json.dumps(chosen, sort_keys=True))  # fmt: skip
    return chosen
