"""Promotion: export the evaluated weights as a SavedModel in the layout TF Serving and KServe load, and move
the "current model" pointer atomically.

Layout under the promotion root (local, gs:// or s3://):

    current.json          the pointer: version, state, saved_model, metrics, checkpoint, ...
    1/saved_model.pb      integer version folders, increasing: TF Serving and KServe serve the highest
    1/variables/...
    2/...

A promotion (1) claims the next version number by replacing `current.json` with a compare-and-swap against
the version the gate read (state "exporting"), so of two concurrent promotions exactly one claims it and the
other fails having written nothing; (2) writes the SavedModel into the claimed folder with create-if-absent on
every object and `saved_model.pb` last (a server polling the root never loads a half-written version); (3)
marks the pointer "ready". A promotion never writes into a folder it did not claim.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from components.common import storage
from components.train.model import predict_logits

logger = logging.getLogger(__name__)

POINTER = "current.json"
VERSION_FOLDER = re.compile(r"^(\d+)/")
SAVED_MODEL_PROTO = "saved_model.pb"


class PromotionConflictError(RuntimeError):
    """Another promotion moved the pointer after this one read it."""


class ServingModule(tf.Module):
    """uint8 images [N, 32, 32, 3] -> class probabilities, the top class and its name."""

    def __init__(self, model, label_names: list[str], test_time_augmentation: str = "none"):
        super().__init__()
        self.model = model
        self.test_time_augmentation = test_time_augmentation
        self.label_names = tf.constant(label_names)
        height, width, channels = model.input_shape[1:]
        self.serve = tf.function(
            self._serve, input_signature=[tf.TensorSpec([None, height, width, channels], tf.uint8, name="images")]
        )

    def _serve(self, images):
        logits = predict_logits(self.model, images, self.test_time_augmentation)
        probabilities = tf.nn.softmax(logits, axis=-1)
        top = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "classes": top, "class_names": tf.gather(self.label_names, top)}


def export_saved_model(
    model, label_names: list[str], directory: str | Path, test_time_augmentation: str = "none"
) -> None:
    """The serving signature includes the test-time augmentation, so the server answers as evaluation measured."""
    module = ServingModule(model, label_names, test_time_augmentation)
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


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
    from components.common.model_directory import ModelDirectory
    from components.evaluate.restore import build_from_config, checkpoint_step, read_train_config, restore_weights

    directory = ModelDirectory(model_dir, cache_dir)
    directory.pull()
    train_config = read_train_config(directory.local, model_dir)
    model = build_from_config(train_config)
    used = restore_weights(model, str(directory.local / Path(checkpoint).name), weights)
    label_names = train_config["resolved"]["label_names"]
    record = {**record, "weights": used, "step": checkpoint_step(checkpoint)}
    return promote(model, label_names, root, record, expected_pointer_version)


def read_pointer(root: str) -> tuple[dict | None, str]:
    """The current pointer (None when nothing was promoted yet) and its version, for the compare-and-swap."""
    content, version = storage.publisher_for(root).read_versioned(POINTER)
    return (json.loads(content) if content else None), version


@dataclass(frozen=True)
class Promotion:
    version: int
    saved_model: str
    pointer: str


def next_version(root: str, pointer: dict | None) -> int:
    """One more than any version the pointer or the root's folders know of."""
    known = [
        int(match.group(1)) for name in storage.publisher_for(root).list() if (match := VERSION_FOLDER.match(name))
    ]
    if pointer is not None and isinstance(pointer.get("version"), int):
        known.append(pointer["version"])
    return max(known, default=0) + 1


def _encode(pointer: dict) -> bytes:
    return json.dumps(pointer, indent=2, sort_keys=True).encode()


def promote(model, label_names: list[str], root: str, record: dict, expected_pointer_version: str) -> Promotion:
    """Claim the next version, export the SavedModel into `<root>/<version>/`, and mark it ready in current.json."""
    publisher = storage.publisher_for(root)
    current, seen = read_pointer(root)
    if seen != expected_pointer_version:
        raise PromotionConflictError(
            f"{publisher.uri(POINTER)} was moved by another promotion after this evaluation read it; nothing was "
            "promoted (evaluate again against the new model)"
        )
    version = next_version(root, current)
    target = str(version)
    pointer = {
        **record,
        "version": version,
        "state": "exporting",
        "saved_model": publisher.uri(target),
        "promoted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        publisher.publish(POINTER, _encode(pointer), expected_pointer_version)
    except storage.PublishConflictError as error:
        raise PromotionConflictError(
            f"{publisher.uri(POINTER)} was moved by another promotion after this evaluation read it; nothing was "
            "promoted (evaluate again against the new model)"
        ) from error
    logger.info("claimed version %d under %s; exporting the SavedModel", version, root)
    with tempfile.TemporaryDirectory() as staging:
        export_saved_model(model, label_names, staging, record.get("test_time_augmentation", "none"))
        files = sorted((path for path in Path(staging).rglob("*") if path.is_file()), key=_saved_model_proto_last)
        for path in files:
            name = f"{target}/{path.relative_to(staging).as_posix()}"
            try:
                publisher.publish(name, path.read_bytes(), expected_version=storage.ABSENT)
            except storage.PublishConflictError as error:
                raise PromotionConflictError(
                    f"{publisher.uri(name)} already exists: version {version} holds objects this promotion did not "
                    "write; it is left alone and the pointer stays 'exporting' (the next promotion takes the "
                    "next number)"
                ) from error
    claimed = publisher.version(POINTER)
    try:
        publisher.publish(POINTER, _encode({**pointer, "state": "ready"}), expected_version=claimed)
    except storage.PublishConflictError as error:
        raise PromotionConflictError(
            f"version {version} was exported to {publisher.uri(target)}, but {publisher.uri(POINTER)} was moved by "
            "another promotion before it could be marked ready"
        ) from error
    logger.info("promoted version %d: %s now points at %s", version, publisher.uri(POINTER), pointer["saved_model"])
    return Promotion(version, pointer["saved_model"], publisher.uri(POINTER))


def _saved_model_proto_last(path: Path) -> tuple[bool, str]:
    return path.name == SAVED_MODEL_PROTO, str(path)


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
