"""The gate's baseline, like for like (as TFX's Evaluator does): the promoted model's accuracy on the very images this
run's model was evaluated on, not a number measured on other data.

- When the promoted version was evaluated on the same split of the same dataset, its recorded accuracy is that
  number already.
- Otherwise (new data arrived at the same source, another split) its SavedModel is loaded and evaluated on these
  images, through its serving signature (whatever its architecture).
- A promoted model of other classes, or of another kind of data (synthetic against real), is no baseline at all:
  the demo's model on synthetic data must not block the first real one.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.common import filesystem, storage
from components.common.dataset import default_cache_dir

logger = logging.getLogger(__name__)

BATCH = 500


@dataclass(frozen=True)
class Baseline:
    accuracy: float | None  # None: nothing to compare with
    description: str  # what the accuracy is, or why there is none (for the decision's reasons and the report)


@dataclass(frozen=True)
class EvaluatedData:
    """The images a model was evaluated on, and what identifies them."""

    images: np.ndarray
    labels: np.ndarray
    label_names: list[str]
    dataset_manifest_sha256: str
    split: str
    synthetic: bool


def promoted_baseline(pointer: dict | None, data: EvaluatedData, cache_dir: str | None = None) -> Baseline:
    if pointer is None:
        return Baseline(None, "nothing is promoted yet")
    version = pointer.get("version")
    if pointer.get("label_names") != data.label_names:
        return Baseline(
            None,
            f"the promoted version {version} has classes {pointer.get('label_names')}, this data "
            f"{data.label_names}: it is not a baseline for this model",
        )
    if bool(pointer.get("synthetic_data")) != data.synthetic:
        kind = "synthetic" if pointer.get("synthetic_data") else "real"
        return Baseline(None, f"the promoted version {version} was trained on {kind} data: it is not a baseline here")
    evaluation = pointer.get("evaluation") or {}
    if (evaluation.get("dataset_manifest_sha256"), evaluation.get("split")) == (
        data.dataset_manifest_sha256,
        data.split,
    ):
        return Baseline(
            float(pointer["metrics"]["accuracy"]),
            f"version {version} on the same {len(data.labels)} images (its recorded evaluation)",
        )
    accuracy = saved_model_accuracy(pointer["saved_model"], data, cache_dir)
    return Baseline(accuracy, f"version {version} evaluated on the same {len(data.labels)} images ({data.split} split)")


def local_saved_model(uri: str, cache_dir: str | None = None) -> Path:
    """A promoted version's SavedModel as a local folder (a remote one copied into the cache, its checkpoint left)."""
    if not filesystem.is_remote(uri):
        return Path(uri)
    key = hashlib.sha256(filesystem.normalize_uri(uri).encode()).hexdigest()[:16]
    local = Path(cache_dir or default_cache_dir()) / "promoted" / key
    publisher = storage.publisher_for(uri)
    for name in publisher.list():
        if not name.startswith("checkpoint/") and not (local / name).exists():
            storage.download_file(publisher.uri(name), local / name)
    return local


def saved_model_accuracy(uri: str, data: EvaluatedData, cache_dir: str | None = None) -> float:
    """The accuracy of a SavedModel's serving signature on `data`."""
    import tensorflow as tf

    try:
        serve = tf.saved_model.load(str(local_saved_model(uri, cache_dir))).signatures["serving_default"]
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise ValueError(f"the promoted model at {uri} cannot be loaded to compare with ({error})") from error
    predicted = [
        serve(images=tf.constant(data.images[start : start + BATCH]))["classes"].numpy()
        for start in range(0, len(data.labels), BATCH)
    ]
    accuracy = float(np.mean(np.concatenate(predicted) == data.labels))
    logger.info("the promoted model at %s: accuracy %.4f on this run's %s split", uri, accuracy, data.split)
    return accuracy
