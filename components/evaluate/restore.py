"""Rebuilding the trained model from its model directory and loading a checkpoint's weights by name."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from components.common.checkpoint_reader import UnreadableCheckpointError, open_whole
from components.common.model import model_spec_of, variable_name
from components.common.model_directory import (
    RESOLVED_CONFIG,
    RESOLVED_CONFIG_SCHEMA,
    checkpoint_key,
    read_document,
)

logger = logging.getLogger(__name__)


class EvaluationError(ValueError):
    """The model directory, checkpoint or dataset cannot be evaluated as asked; never blessed."""


def read_train_config(model_dir: Path, origin: str) -> dict:
    """The model directory's config.json, read back as every document is and its model_spec checked as train
    checks it (a width or class count train would refuse is refused here before anything is built)."""
    try:
        train_config = read_document(model_dir, RESOLVED_CONFIG, RESOLVED_CONFIG_SCHEMA, origin)
    except FileNotFoundError as error:
        raise EvaluationError(
            f"{origin}: no {RESOLVED_CONFIG}; it is not a model directory of the train stage"
        ) from error
    model_spec_of(train_config, f"{origin}/{RESOLVED_CONFIG}")
    return train_config


def restore_weights(model, checkpoint_path: str, weights: str = "auto") -> str:
    """Load `checkpoint_path` into `model` by variable name; returns "ema" or "raw" (which weights were used).

    Every model variable must be in the checkpoint with the same shape: a checkpoint of another
    architecture or number of classes is an error, as are NaN or Inf weights.
    """
    try:
        reader = open_whole(checkpoint_path)
    except UnreadableCheckpointError as error:
        raise EvaluationError(str(error)) from error
    shapes = reader.get_variable_to_shape_map()
    trainable = {variable_name(variable) for variable in model.trainable_variables}
    has_ema = all(checkpoint_key("ema", name) in shapes for name in trainable)
    if weights == "ema" and not has_ema:
        raise EvaluationError(f"{checkpoint_path}: has no moving-average (ema/...) weights; train with --ema-decay")
    use_ema = has_ema and weights in ("auto", "ema")
    for variable in model.variables:
        name = variable_name(variable)
        key = checkpoint_key("ema" if use_ema and name in trainable else "weights", name)
        if key not in shapes:
            raise EvaluationError(
                f"{checkpoint_path}: has no variable {name!r}; the checkpoint is of another architecture"
            )
        if list(shapes[key]) != list(variable.shape):
            raise EvaluationError(
                f"{checkpoint_path}: {name} has shape {list(shapes[key])}, the model expects {list(variable.shape)} "
                "(another architecture or number of classes)"
            )
        value = reader.get_tensor(key)
        if not np.all(np.isfinite(value)):
            raise EvaluationError(f"{checkpoint_path}: variable {name} holds NaN or Inf")
        variable.assign(value)
    return "ema" if use_ema else "raw"
