"""Promotion: export the evaluated weights as a SavedModel and move the "current model" pointer atomically.

The pointer `<root>/current.json` is replaced with a compare-and-swap against the version read before
the gate compared with it (a generation precondition on gs://), so of two concurrent promotions at most
one wins; the other fails with PromotionConflictError and leaves the pointer alone.
"""

from __future__ import annotations

import datetime
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from components.common import storage
from components.train.data import normalize

logger = logging.getLogger(__name__)

POINTER = "current.json"


class PromotionConflictError(RuntimeError):
    """Another promotion moved the pointer after this one read it."""


class ServingModule(tf.Module):
    """uint8 images [N, 32, 32, 3] -> class probabilities, the top class and its name."""

    def __init__(self, model, label_names: list[str]):
        super().__init__()
        self.model = model
        self.label_names = tf.constant(label_names)
        height, width, channels = model.input_shape[1:]
        self.serve = tf.function(
            self._serve, input_signature=[tf.TensorSpec([None, height, width, channels], tf.uint8, name="images")]
        )

    def _serve(self, images):
        probabilities = tf.nn.softmax(self.model(normalize(images), training=False), axis=-1)
        top = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "classes": top, "class_names": tf.gather(self.label_names, top)}


def export_saved_model(model, label_names: list[str], directory: str | Path) -> None:
    module = ServingModule(model, label_names)
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


def version_name(step: int) -> str:
    return f"step-{step:08d}-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def promote_checkpoint(
    model_dir: str,
    checkpoint: str,
    weights: str,
    root: str,
    record: dict,
    expected_pointer_version: str,
    cache_dir: str | None = None,
) -> Promotion:
    """Promote a checkpoint that an earlier evaluation blessed (the pipeline's promote step)."""
    from components.evaluate.restore import build_from_config, checkpoint_step, read_train_config, restore_weights
    from components.train.checkpoints import ModelDirectory

    directory = ModelDirectory(model_dir, cache_dir)
    directory.pull()
    train_config = read_train_config(directory.local, model_dir)
    model = build_from_config(train_config)
    used = restore_weights(model, str(directory.local / Path(checkpoint).name), weights)
    label_names = train_config["resolved"]["label_names"]
    step = checkpoint_step(checkpoint)
    return promote(model, label_names, root, version_name(step), {**record, "weights": used}, expected_pointer_version)


def read_pointer(root: str) -> tuple[dict | None, str]:
    """The current pointer (None when nothing was promoted yet) and its version, for the compare-and-swap."""
    content, version = storage.publisher_for(root).read_versioned(POINTER)
    return (json.loads(content) if content else None), version


@dataclass(frozen=True)
class Promotion:
    version: str
    saved_model: str
    pointer: str


def promote(
    model, label_names: list[str], root: str, version: str, record: dict, expected_pointer_version: str
) -> Promotion:
    """Upload the SavedModel to `<root>/versions/<version>/` and point `<root>/current.json` at it."""
    publisher = storage.publisher_for(root)
    target = f"versions/{version}"
    with tempfile.TemporaryDirectory() as staging:
        export_saved_model(model, label_names, staging)
        for path in sorted(Path(staging).rglob("*")):
            if path.is_file():
                publisher.publish(f"{target}/{path.relative_to(staging).as_posix()}", path.read_bytes())
    pointer = {
        **record,
        "version": version,
        "saved_model": publisher.uri(target),
        "promoted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        publisher.publish(POINTER, json.dumps(pointer, indent=2, sort_keys=True).encode(), expected_pointer_version)
    except storage.PublishConflictError as error:
        raise PromotionConflictError(
            f"{publisher.uri(POINTER)} was moved by another promotion after this evaluation read it; "
            f"version {version} was exported but not promoted"
        ) from error
    logger.info("promoted %s: %s now points at %s", version, publisher.uri(POINTER), pointer["saved_model"])
    return Promotion(version, pointer["saved_model"], publisher.uri(POINTER))


def warm_start_checkpoint(explicit: str, root: str, from_promoted: bool) -> str:
    """What a (scheduled) training run starts from: an explicit checkpoint, else the promoted model's, else ""."""
    if explicit:
        return explicit
    if not (from_promoted and root):
        return ""
    pointer, _version = read_pointer(root)
    if pointer is None:
        logger.info("nothing promoted under %s yet: training from scratch", root)
        return ""
    logger.info("warm-starting from the promoted model %s (%s)", pointer.get("version"), pointer["checkpoint"])
    return pointer["checkpoint"]
