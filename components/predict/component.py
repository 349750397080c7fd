"""The predict KFP component: batch prediction with a promoted model (a lightweight component over predict.py)."""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("evaluate"), install_kfp_package=False)
def predict_component(
    model: str,
    images: str,
    predictions: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.HTML],
    summary: dsl.Output[dsl.Metrics],
    split: str = "eval",
    top_k: int = 3,
    batch_size: int = 256,
    resize: str = "",
) -> int:
    """Score `images` (a folder, a prepared dataset's `split`, or a gs:// / s3:// prefix) with `model` (a promotion
    root's current version, a version folder or a SavedModel); `predictions` is the JSON Lines file (one image per
    line, its top-k classes), `report` the HTML summary, `summary` the counts. Returns how many images were scored."""
    from components.common.cli import component_errors
    from components.predict.kfp_run import run_predict

    with component_errors("predict", (ValueError,)):
        return run_predict(model, images, predictions, report, summary, split, top_k, batch_size, resize)
