"""The baseline of the training-speed benchmarks: a bare `tf.function` step (forward, loss, gradients,
`apply_gradients`) of a model and optimizer on one fixed random batch, with nothing around it."""

from __future__ import annotations

import time


def _bare_step(model, optimizer, batch: int):
    import tensorflow as tf

    images = tf.cast(tf.random.uniform([batch, 32, 32, 3], 0, 256, dtype=tf.int32), tf.uint8)
    labels = tf.random.uniform([batch], 0, 10, dtype=tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    def timed(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            loss = step()
        float(loss)
        return time.perf_counter() - start

    return timed


def bare_seconds_per_step(model, optimizer, batch: int, steps: int, warmup_steps: int) -> float:
    """Seconds per step of the bare step; the difference of two timed runs cancels the fixed costs."""
    timed = _bare_step(model, optimizer, batch)
    timed(warmup_steps)  # trace and warm up
    return (timed(warmup_steps + steps) - timed(warmup_steps)) / steps


def bare_window_seconds(model, optimizer, batch: int, window_steps: int, windows: int) -> list[float]:
    """Seconds per step of the bare step in each of `windows` consecutive windows, after one window of warm-up
    (as a training loop's progress lines measure it)."""
    timed = _bare_step(model, optimizer, batch)
    timed(window_steps)  # trace and warm up
    return [timed(window_steps) / window_steps for _ in range(windows)]
