"""The evaluate and promote KFP components (lightweight Python components over the project's functions)."""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def evaluate_component(
    dataset: dsl.Input[dsl.Dataset],
    model: dsl.Input[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    classification: dsl.Output[dsl.ClassificationMetrics],
    report: dsl.Output[dsl.HTML],
    evaluation: dsl.Output[dsl.Artifact],
    mode: str = "latest",
    split: str = "eval",
    weights: str = "auto",
    accuracy_threshold: float = 0.0,
    baseline: str = "",
    baseline_tolerance: float = 0.0,
    promotion_root: str = "",
    data_blocking: str = "",
) -> bool:
    """Evaluate the model's latest checkpoint (`mode` "all": every kept checkpoint, the last one gated); returns
    whether it is blessed for promotion.

    `evaluation` holds the summary JSON and, in its metadata, the decision and its reasons and what the
    promote step needs. With `promotion_root`, its current.json is the baseline (unless `baseline` is given)
    and its version is recorded, so the promote step only succeeds if nobody promoted in between. `data_blocking`
    (check_data_component's output): a data check finding that blocks promotion, named in the decision.
    """
    from components.common.cli import component_errors
    from components.evaluate.kfp_run import EXPECTED_ERRORS, run_evaluate

    with component_errors("evaluate", EXPECTED_ERRORS):
        return run_evaluate(
            dataset,
            model,
            metrics,
            classification,
            report,
            evaluation,
            mode=mode,
            split=split,
            weights=weights,
            accuracy_threshold=accuracy_threshold,
            baseline=baseline,
            baseline_tolerance=baseline_tolerance,
            promotion_root=promotion_root,
            data_blocking=data_blocking,
        )


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def check_data_component(
    dataset: dsl.Input[dsl.Dataset],
    findings: dsl.Output[dsl.Artifact],
    visualization: dsl.Output[dsl.Markdown],
    mode: str = "warn",
    reference: str = "",
    promotion_root: str = "",
    thresholds: dict = {},  # noqa: B006 (KFP parameters take literal defaults)
) -> str:
    """Check the dataset's statistics against `reference` ("": the promoted model's training data under
    `promotion_root`). `mode` "warn" logs the findings, "block" returns the one that blocks promotion (pass it to
    evaluate_component's data_blocking), "fail" stops the run on it. `findings` holds them as JSON; `visualization`
    shows the statistics beside the reference's, and the findings."""
    from components.common.cli import component_errors
    from components.evaluate.kfp_run import EXPECTED_ERRORS, run_check_data

    with component_errors("data check", EXPECTED_ERRORS):
        return run_check_data(dataset, findings, visualization, mode, reference, promotion_root, thresholds)


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def promote_component(
    model: dsl.Input[dsl.Model],
    evaluation: dsl.Input[dsl.Artifact],
    dataset: dsl.Input[dsl.Dataset],
    promotion_root: str,
    promoted: dsl.Output[dsl.Model],
    serving_version: str = "",
    model_registry: str = "",
    registered_model_name: str = "cifar10",
    run_id: str = "",
    run_name: str = "",
    train_image: str = "",
) -> int:
    """Export the blessed checkpoint as a SavedModel (and its checkpoint beside it, for warm starts) into the next
    integer version folder under `promotion_root` (the layout TF Serving and KServe load), check it loads in
    `serving_version` ("": the release the root declares, if any) and answers canary requests, and move
    `promotion_root/current.json` to it; returns the version (0 when another promotion went first with a model at
    least as good: decided again on the evaluation's images).

    `promoted` holds the pointer as written; its metadata names the SavedModel (`saved_model`) and `version`.

    With `model_registry` (http(s)://HOST[:PORT]), the version is then registered in Kubeflow's Model Registry under
    `registered_model_name`, with its lineage (`run_id`, `run_name`: the KFP run; `train_image`: the image that
    trained it). A registry that cannot be reached leaves the promotion standing: the step says so in one line and
    in `promoted`'s metadata (`registered`: false, `registration`: the line), and still succeeds."""
    from components.common.cli import component_errors
    from components.evaluate.kfp_run import EXPECTED_ERRORS, run_promote, step_lineage

    with component_errors("evaluate", EXPECTED_ERRORS):
        return run_promote(
            model, evaluation, dataset, promotion_root, serving_version, promoted, model_registry,
            registered_model_name, step_lineage(run_id, run_name, train_image),
        )  # fmt: skip


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def warm_start_component(warm_start: str, promotion_root: str, from_promoted: bool) -> str:
    """The checkpoint to warm-start from: `warm_start` when given, else (with `from_promoted`) the checkpoint of
    the currently promoted model under `promotion_root`, else "" (train from scratch)."""
    from components.common.cli import component_errors
    from components.evaluate.kfp_run import EXPECTED_ERRORS
    from components.evaluate.promote import warm_start_checkpoint

    with component_errors("evaluate", EXPECTED_ERRORS):
        return warm_start_checkpoint(warm_start, promotion_root, from_promoted)
