"""What the evaluate and promote KFP components run: their parameters -> an EvaluateConfig -> the stage -> the
artifacts' contents."""

from __future__ import annotations

import json
from typing import Any

from components.common import outputs
from components.common.kfp_parameters import config_from_parameters
from components.common.model_directory import CheckpointError, artifact_location
from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import Evaluator, evaluate
from components.evaluate.promote import PromotionConflictError
from components.evaluate.registry import Lineage

# What ends the stage with one line and exit 2 (bad input, final), not a traceback; also its command line's.
EXPECTED_ERRORS = (ValueError, CheckpointError, PromotionConflictError)


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
    outputs.write_text(report.path, result.report_html, "evaluation report artifact")
    outputs.write_text(evaluation.path, json.dumps(result.summary(), indent=2, sort_keys=True), "evaluation artifact")
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


def run_promote(
    model: Any,
    evaluation: Any,
    dataset: Any,
    promotion_root: str,
    serving_version: str,
    promoted: Any,
    model_registry: str = "",
    registered_model_name: str = "cifar10",
    lineage: Lineage | None = None,
) -> int:
    """Promote what the evaluation blessed; refuses an evaluation that was not blessed. When another promotion moved
    the pointer since, the step decides again against it, on the same images (it may then end not promoted: 0).
    With `model_registry`, the promoted version is registered there; a registration that fails leaves the
    promotion standing and says so (the step's log, and `registered`/`registration` in `promoted`'s metadata)."""
    details = evaluation.metadata
    if not details.get("blessed"):
        raise ValueError(f"refusing to promote: the evaluation was not blessed ({details.get('decision')})")
    record = dict(details["record"])
    config = config_from_parameters(
        EvaluateConfig,
        {
            "data": artifact_location(dataset),
            "model_dir": model.metadata.get("model_dir") or artifact_location(model),
            "split": record["evaluation"]["split"],
            "checkpoint": record["checkpoint"],
            "weights": record["weights"],
            "promote_to": promotion_root,
            "serving_version": serving_version,
            "model_registry": model_registry,
            "registered_model_name": registered_model_name,
        },
        "promote component parameters",
    )
    outcome = Evaluator(config, lineage).promote_from_record(record, details["pointer_version"])
    if outcome.promotion is None:
        summary = outcome.decision.summary() if outcome.decision else "not promoted"
        promoted.metadata.update({"promoted": False, "decision": summary})
        outputs.write_json(promoted.path, {"promoted": False, "decision": summary}, "promotion artifact")
        return 0
    # the pointer as this promotion wrote it
    outputs.write_text(promoted.path, json.dumps(outcome.pointer, indent=2, sort_keys=True), "promotion artifact")
    promoted.metadata.update(
        {
            "promoted": True,
            "saved_model": outcome.promotion.saved_model,
            "version": outcome.promotion.version,
            "promotion_root": promotion_root,
            "framework": "tensorflow",
            "accuracy": outcome.pointer["metrics"]["accuracy"],
        }
    )
    if outcome.registration is not None:
        promoted.metadata.update(
            {"registered": outcome.registration.registered, "registration": outcome.registration.line}
        )
    return outcome.promotion.version


def run_check_data(
    dataset: Any, findings: Any, visualization: Any, mode: str, reference: str, promotion_root: str, thresholds: dict
) -> str:
    """The data check on the dataset artifact; returns the line that blocks promotion ("" for none)."""
    from components.common.statistics_view import markdown
    from components.evaluate.data_check import CheckDataConfig, check_data

    config = CheckDataConfig(
        data=artifact_location(dataset), mode=mode, reference=reference, promotion_root=promotion_root,
        thresholds=dict(thresholds),
    )  # fmt: skip
    outcome = check_data(config)
    outputs.write_json(findings.path, outcome.summary(mode), "data check artifact")
    title = f"Data check against {outcome.reference}"
    outputs.write_text(visualization.path, markdown(outcome.statistics, outcome.reference_statistics,
                       outcome.findings, title), "data check visualization")  # fmt: skip
    findings.metadata.update(
        {"errors": sum(f.severity == "error" for f in outcome.findings), "blocking": outcome.blocking}
    )
    return outcome.blocking


def step_lineage(run_id: str, run_name: str, train_image: str) -> Lineage:
    """The promote step's lineage: its KFP run, the namespace it runs in (on a cluster), the image that trained."""
    from components.common.pod import namespace_of_this_pod

    namespace = namespace_of_this_pod() or ""  # "" outside a pod (kfp.local)
    return Lineage(run_id=run_id, run_name=run_name, namespace=namespace, image=train_image)
