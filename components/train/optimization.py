"""Learning-rate schedules, optimizers, and the gradient processing of TF-Slim's `create_train_op`.

Gradient processing acts on the all-reduced (global) gradient, in this order: multipliers by variable
name, clipping by value, by each variable's norm, by the global norm. Which variables train at all is
decided by name too (`trainable` / `frozen` regexes), before any gradient is computed.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import keras
import tensorflow as tf

from components.common.model import variable_name
from components.train.config import TrainConfig, parse_assignments

logger = logging.getLogger(__name__)


# -- learning rate ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """The learning rate as a function of the global step (a plain function, usable inside tf.function)."""

    kind: str
    base: float
    steps_per_epoch: float
    total_steps: int
    boundary_epochs: tuple[float, ...] = ()
    decay_factors: tuple[float, ...] = ()
    warmup_epochs: float = 0.0
    triangle: tuple[float, float, float] = (0.2, 0.23, 0.07)  # start, peak (fraction of training), end

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        if self.kind == "piecewise":
            boundaries = [float(epoch * self.steps_per_epoch) for epoch in self.boundary_epochs]
            values = [self.base] + [self.base * factor for factor in self.decay_factors]
            rate = tf.constant(values[0], tf.float32)
            for boundary, value in zip(boundaries, values[1:], strict=True):
                rate = tf.where(step >= boundary, tf.constant(value, tf.float32), rate)
        elif self.kind == "triangular":
            # airbench: linear from start x base up to base at the peak, then linear down to end x base.
            start, peak, end = self.triangle
            peak_step = float(max(1, int(peak * self.total_steps)))
            rising = start + (1.0 - start) * step / peak_step
            falling = 1.0 + (end - 1.0) * (step - peak_step) / float(max(1.0, self.total_steps - peak_step))
            rate = self.base * tf.where(step < peak_step, rising, tf.maximum(falling, end))
        elif self.kind == "linear":  # airbench94_muon: from the base rate down to zero at the end
            rate = self.base * tf.maximum(1.0 - step / float(max(1, self.total_steps)), 0.0)
        elif self.kind == "cosine":
            progress = tf.minimum(step / float(max(1, self.total_steps)), 1.0)
            rate = self.base * 0.5 * (1.0 + tf.cos(math.pi * progress))
        else:
            rate = tf.constant(self.base, tf.float32)
        warmup_steps = self.warmup_epochs * self.steps_per_epoch
        if warmup_steps > 0:
            rate = rate * tf.minimum(1.0, (step + 1.0) / warmup_steps)
        return rate


def make_schedule(config: TrainConfig, steps_per_epoch: float, total_steps: int) -> Schedule:
    return Schedule(
        kind=config.schedule,
        base=config.scaled_learning_rate(),
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        boundary_epochs=tuple(config.boundary_epochs),
        decay_factors=tuple(config.decay_factors),
        warmup_epochs=config.warmup_epochs,
        triangle=(config.triangle_start, config.triangle_peak, config.triangle_end),
    )


# -- optimizers ---------------------------------------------------------------------------------------------


def make_optimizer(config: TrainConfig) -> keras.optimizers.Optimizer:
    """The optimizer whose per-variable `update_step` the loop applies (the rate is passed per step); with muon, the
    one of every variable but the convolution kernels (`Muon` updates those)."""
    rate = config.scaled_learning_rate()
    if config.optimizer in ("sgd", "muon"):
        return keras.optimizers.SGD(rate, momentum=config.momentum, nesterov=config.nesterov)
    if config.optimizer in ("adam", "adamw"):  # adamw: Adam plus the loop's decoupled weight decay
        return keras.optimizers.Adam(rate)
    if config.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(rate, momentum=config.momentum)
    raise ValueError(f"optimizer: {config.optimizer!r} is not one of sgd, adam, adamw, rmsprop, muon")


# -- Muon -----------------------------------------------------------------------------------------------------
# Jordan et al. 2024 (github.com/KellerJordan/cifar10-airbench, airbench94_muon.py): for each convolution kernel,
# momentum on the gradient, then its update replaced by the nearest semi-orthogonal matrix (approximately: a quintic
# Newton-Schulz iteration whose coefficients maximise the slope at zero, so a few steps suffice; the singular values
# land near 1, not on it), applied to the kernel renormalised to norm sqrt(output channels).

NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def is_muon_variable(variable) -> bool:
    """What Muon updates: convolution kernels (rank 4: height, width, inputs, outputs)."""
    return len(variable.shape) == 4


def orthogonalized(matrix: tf.Tensor, steps: int, epsilon: float = 1e-7) -> tf.Tensor:
    """Approximately U V^T of `matrix` = U S V^T (rows x columns), by `steps` quintic Newton-Schulz iterations on the
    matrix scaled to spectral norm at most 1 (by its Frobenius norm)."""
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    x = matrix / (tf.norm(matrix) + epsilon)
    tall = matrix.shape[0] > matrix.shape[1]
    if tall:
        x = tf.transpose(x)
    for _ in range(steps):
        gram = tf.matmul(x, x, transpose_b=True)
        x = a * x + tf.matmul(b * gram + c * tf.matmul(gram, gram), x)
    return tf.transpose(x) if tall else x


def muon_direction(kernel_update: tf.Tensor, steps: int) -> tf.Tensor:
    """A convolution kernel's update [h, w, in, out], orthogonalised as a matrix of one row per output filter."""
    height, width, inputs, outputs = kernel_update.shape
    rows = tf.reshape(tf.transpose(kernel_update, [3, 0, 1, 2]), [outputs, height * width * inputs])
    return tf.transpose(tf.reshape(orthogonalized(rows, steps), [outputs, height, width, inputs]), [1, 2, 3, 0])


def renormalized(kernel: tf.Tensor) -> tf.Tensor:
    """The kernel scaled to norm sqrt(output channels): what Muon does before each step."""
    outputs = float(kernel.shape[-1])
    return kernel * (outputs**0.5 / tf.norm(kernel))


def apply_muon(kernel, momentum_buffer, gradient, rate, momentum: float, nesterov: bool, steps: int) -> None:
    """Muon's step on one convolution kernel: momentum on the gradient, then the kernel renormalised and moved by
    the orthogonalised (Nesterov) momentum at `rate`."""
    gradient = tf.cast(gradient, momentum_buffer.dtype)
    momentum_buffer.assign(momentum * momentum_buffer + gradient)
    direction = gradient + momentum * momentum_buffer if nesterov else momentum_buffer
    kernel.assign(renormalized(kernel))
    kernel.assign_sub(tf.cast(rate, kernel.dtype) * muon_direction(direction, steps))


# -- which variables train ----------------------------------------------------------------------------------


def select_trainable(variables: Sequence, trainable: str | None, frozen: str | None) -> tuple[list, list]:
    """Split variables into (trained, frozen) by name: `trainable` keeps matches, `frozen` removes them."""
    trained, held = [], []
    for variable in variables:
        name = variable_name(variable)
        keep = (trainable is None or re.search(trainable, name)) and not (frozen and re.search(frozen, name))
        (trained if keep else held).append(variable)
    if not trained:
        raise ValueError(f"trainable={trainable!r} / frozen={frozen!r} leave no variable to train")
    if held:
        logger.info("frozen variables (%d): %s", len(held), ", ".join(variable_name(v) for v in held))
    return trained, held


# -- gradient processing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradientProcessing:
    multipliers: tuple[float, ...]  # one per variable (1.0 where no pattern matched)
    clip_value: float | None = None
    clip_norm: float | None = None
    clip_global_norm: float | None = None

    @classmethod
    def for_variables(cls, config: TrainConfig, variables: Sequence) -> GradientProcessing:
        rules = [(pattern, float(factor)) for pattern, factor in parse_assignments(config.gradient_multipliers, "")]
        multipliers = []
        for variable in variables:
            factor = 1.0
            for pattern, value in rules:
                if re.search(pattern, variable_name(variable)):
                    factor = value  # the first matching rule wins
                    break
            multipliers.append(factor)
        for pattern, _value in rules:
            if not any(re.search(pattern, variable_name(variable)) for variable in variables):
                raise ValueError(f"gradient_multipliers: {pattern!r} matches no trained variable")
        return cls(tuple(multipliers), config.clip_value, config.clip_norm, config.clip_global_norm)

    def __call__(self, gradients: list[tf.Tensor]) -> tuple[list[tf.Tensor], tf.Tensor]:
        """Processed gradients and the global norm of the gradients as they came in (for summaries)."""
        norm = tf.linalg.global_norm(gradients)
        processed = [
            gradient if factor == 1.0 else gradient * tf.cast(factor, gradient.dtype)
            for gradient, factor in zip(gradients, self.multipliers, strict=True)
        ]
        if self.clip_value is not None:
            processed = [tf.clip_by_value(gradient, -self.clip_value, self.clip_value) for gradient in processed]
        if self.clip_norm is not None:
            processed = [tf.clip_by_norm(gradient, self.clip_norm) for gradient in processed]
        if self.clip_global_norm is not None:
            processed, _ = tf.clip_by_global_norm(
                processed, self.clip_global_norm, use_norm=tf.linalg.global_norm(processed)
            )
        return processed, norm


def all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tensor)) for tensor in tensors])
