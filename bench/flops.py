"""How close a training step is to the machine: the network's forward FLOPs per image, counted by TensorFlow's
profiler on the traced forward pass, and this CPU's float32 matrix-multiply peak, measured.

A training step costs about three forward passes per image (forward, and the backward pass's two products: the
gradients of the activations and of the weights), so achieved FLOP/s = 3 x forward FLOPs x images/s.
"""

from __future__ import annotations

import time


def forward_flops(model, image_shape: tuple[int, int, int]) -> int:
    """Floating-point operations of one image's forward pass through `model` (inference mode), as TensorFlow's
    profiler counts them from the traced graph (a multiply-add is two)."""
    import tensorflow as tf

    forward = tf.function(lambda images: model(images, training=False))
    graph = forward.get_concrete_function(tf.TensorSpec([1, *image_shape], tf.uint8)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return int(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)


def matmul_peak_flops(size: int = 2048, seconds: float = 3.0, dtype: str = "float32") -> float:
    """FLOP/s of a `size` x `size` matrix product of `dtype` on every core, the best of repeats for `seconds`."""
    import tensorflow as tf

    left = tf.cast(tf.random.normal([size, size]), dtype)
    right = tf.cast(tf.random.normal([size, size]), dtype)
    product = tf.function(lambda: tf.linalg.matmul(left, right))
    product().numpy()  # trace and warm up
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        product().numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
