"""What the predict KFP component runs: its parameters -> a PredictConfig -> the stage, into its artifacts."""

from __future__ import annotations

from typing import Any

from components.common.kfp_parameters import config_from_parameters
from components.predict.config import PredictConfig
from components.predict.predict import predict


def run_predict(
    model: str, images: str, predictions: Any, report: Any, summary: Any, split: str, top_k: int, batch_size: int,
    resize: str,
) -> int:  # fmt: skip
    values = {
        "model": model, "images": images, "output": predictions.path, "report": report.path, "split": split,
        "top_k": top_k, "batch_size": batch_size, "resize": resize,
    }  # fmt: skip
    config = config_from_parameters(PredictConfig, values, "predict component parameters")
    result = predict(config)
    summary.log_metric("scored", result["scored"])
    summary.log_metric("skipped", result["skipped"])
    predictions.metadata.update({"model": result["model"], "images": images, "scored": result["scored"]})
    return result["scored"]
