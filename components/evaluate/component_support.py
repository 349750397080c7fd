"""What the evaluate and promote KFP components do with their artifacts."""

from __future__ import annotations

from typing import Any

from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import evaluate
from components.evaluate.promote import promote_checkpoint
from components.train.component_support import artifact_location


def run_evaluate(dataset: Any, model: Any, metrics: Any, classification: Any, report: Any, **options: Any):
    promotion_root = options.pop("promotion_root") or None
    config = EvaluateConfig(
        data=artifact_location(dataset),
        model_dir=model.metadata.get("model_dir") or artifact_location(model),
        split=options["split"],
        weights=options["weights"],
        accuracy_threshold=options["accuracy_threshold"],
        baseline=options["baseline"] or None,
        baseline_tolerance=options["baseline_tolerance"],
        compare_with=promotion_root,
    )
    result = evaluate(config)
    for name, value in result.final.metrics.scalars().items():
        metrics.log_metric(name, value)
    metrics.log_metric("step", result.final.step)
    metrics.log_metric("blessed", 1.0 if result.decision.blessed else 0.0)
    classification.log_confusion_matrix(result.label_names, result.final.metrics.confusion_matrix)
    with open(report.path, "w") as handle:
        handle.write(result.report_html)
    return (
        result.decision.blessed,
        result.decision.summary(),
        result.final.checkpoint,
        result.final.weights,
        result.pointer_version,
        result.record,
    )


def run_promote(model: Any, promotion_root: str, checkpoint: str, weights: str, pointer_version: str, record: dict):
    model_dir = model.metadata.get("model_dir") or artifact_location(model)
    promotion = promote_checkpoint(model_dir, checkpoint, weights, promotion_root, record, pointer_version)
    return promotion.version
