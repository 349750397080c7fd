"""What the evaluate and promote KFP components run: their parameters -> an EvaluateConfig -> the stage -> the
artifacts' contents."""

from __future__ import annotations

import json
from typing import Any

from components.common import storage
from components.common.kfp_parameters import config_from_parameters
from components.common.model_directory import artifact_location
from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import evaluate
from components.evaluate.promote import promote_checkpoint


def run_evaluate(
    dataset: Any, model: Any, metrics: Any, classification: Any, report: Any, evaluation: Any, **options: Any
) -> bool:
    promotion_root = options.pop("promotion_root")
    values = {
        **options,
        "compare_with": promotion_root,  # evaluate only reads it; the promote step writes there
        "data": artifact_location(dataset),
        "model_dir": model.metadata.get("model_dir") or artifact_location(model),
    }
    config = config_from_parameters(EvaluateConfig, values, "evaluate component parameters")
    result = evaluate(config)
    for name, value in result.final.metrics.scalars().items():
        metrics.log_metric(name, value)
    metrics.log_metric("step", result.final.step)
    metrics.log_metric("blessed", 1.0 if result.decision.blessed else 0.0)
    classification.log_confusion_matrix(result.label_names, result.final.metrics.confusion_matrix)
    with open(report.path, "w") as handle:
        handle.write(result.report_html)
    with open(evaluation.path, "w") as handle:
        json.dump(result.summary(), handle, indent=2, sort_keys=True)
    evaluation.metadata.update(
        {
            "blessed": result.decision.blessed,
            "decision": result.decision.summary(),
            "checkpoint": result.final.checkpoint,
            "weights": result.final.weights,
            "pointer_version": result.pointer_version,
            "record": result.record,
        }
    )
    return result.decision.blessed


def run_promote(model: Any, evaluation: Any, promotion_root: str, promoted: Any) -> int:
    """Promote what the evaluation blessed; refuses an evaluation that was not blessed."""
    details = evaluation.metadata
    if not details.get("blessed"):
        raise ValueError(f"refusing to promote: the evaluation was not blessed ({details.get('decision')})")
    model_dir = model.metadata.get("model_dir") or artifact_location(model)
    promotion = promote_checkpoint(
        model_dir,
        details["checkpoint"],
        details["weights"],
        promotion_root,
        dict(details["record"]),
        details["pointer_version"],
    )
    pointer = storage.read_bytes(promotion.pointer)
    with open(promoted.path, "wb") as handle:
        handle.write(pointer)
    promoted.metadata.update(
        {
            "saved_model": promotion.saved_model,
            "version": promotion.version,
            "promotion_root": promotion_root,
            "framework": "tensorflow",
            "accuracy": json.loads(pointer)["metrics"]["accuracy"],
        }
    )
    return promotion.version
