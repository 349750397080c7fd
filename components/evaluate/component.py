"""The evaluate and promote KFP components (lightweight Python components over the project's functions)."""

from typing import NamedTuple

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def evaluate_component(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Input[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    classification: dsl.Output[dsl.ClassificationMetrics],
    report: dsl.Output[dsl.HTML],
    split: str = "eval",
    weights: str = "auto",
    accuracy_threshold: float = 0.0,
    baseline: str = "",
    baseline_tolerance: float = 0.0,
    promotion_root: str = "",
) -> NamedTuple(
    "EvaluationOutputs",
    [
        ("blessed", bool),
        ("decision", str),
        ("checkpoint", str),
        ("weights", str),
        ("pointer_version", str),
        ("record", dict),
    ],
):
    """Evaluate the model's latest checkpoint; `blessed` says whether it may be promoted, `decision` why.

    With `promotion_root`, its current.json is the baseline (unless `baseline` is given) and its version is
    passed on, so the promote step only succeeds if nobody promoted in between.
    """
    from components.common.logs import setup_logging
    from components.evaluate.component_support import run_evaluate

    setup_logging()
    return run_evaluate(
        dataset,
        model,
        metrics,
        classification,
        report,
        split=split,
        weights=weights,
        accuracy_threshold=accuracy_threshold,
        baseline=baseline,
        baseline_tolerance=baseline_tolerance,
        promotion_root=promotion_root,
    )


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def promote_component(
    model: dsl.Input[dsl.Model],
    promotion_root: str,
    checkpoint: str,
    weights: str,
    pointer_version: str,
    record: dict,
) -> str:
    """Export the blessed checkpoint as a SavedModel and move `promotion_root/current.json` to it."""
    from components.common.logs import setup_logging
    from components.evaluate.component_support import run_promote

    setup_logging()
    return run_promote(model, promotion_root, checkpoint, weights, pointer_version, record)
