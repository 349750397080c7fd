"""How close a training step is to the machine: the network's forward FLOPs per image, counted by TensorFlow's
profiler on the traced forward pass, and this CPU's peak for the precision, measured.

A training step costs about three forward passes per image (forward, and the backward pass's two products: the
gradients of the activations and of the weights), so achieved FLOP/s = 3 x forward FLOPs x images/s.

The peak is the best that TensorFlow's matrix kernels reach here: a square matrix product, and well-shaped
convolutions (PEAK_CONVOLUTIONS: a 1x1 one, which is a matrix product through the convolution's kernels, and 3x3
ones). On a CPU
with AMX the bfloat16 convolutions reach more than twice TensorFlow's bfloat16 matrix product (3.0-3.7 against
1.3-1.5 TFLOP/s), so a matrix product alone would understate how much of the machine a step leaves idle.
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


def compute_dtype(precision: str) -> str:
    """The dtype a Keras precision policy computes in."""
    return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(precision, "float32")


def _best_seconds(function, seconds: float) -> float:
    """The shortest of repeated calls of `function` (a tf.function returning a tensor) for `seconds`, after one
    that traces and warms up."""
    function().numpy()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        function().numpy()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak_flops(size: int = 2048, seconds: float = 3.0, dtype: str = "float32") -> float:
    """FLOP/s of a `size` x `size` matrix product of `dtype` on every core, the best of repeats for `seconds`."""
    import tensorflow as tf

    left = tf.cast(tf.random.normal([size, size]), dtype)
    right = tf.cast(tf.random.normal([size, size]), dtype)
    return 2 * size**3 / _best_seconds(tf.function(lambda: tf.linalg.matmul(left, right)), seconds)


# (batch, image side, in channels, out channels, kernel side): shapes at which oneDNN's convolutions ran fastest on
# the AMX machine among those tried, which is fastest varying with the hour (bfloat16 2.3-3.7, 2.8-3.1 and 2.1
# TFLOP/s; float32 0.38, 0.33 and 0.41).
PEAK_CONVOLUTIONS = ((512, 16, 256, 256, 3), (1536, 15, 64, 256, 3), (256, 32, 512, 512, 1))


def convolution_peak_flops(seconds: float = 3.0, dtype: str = "float32") -> float:
    """FLOP/s of the best of the PEAK_CONVOLUTIONS' forward passes in `dtype` on every core, each the best of
    repeats for `seconds` / their number."""
    import tensorflow as tf

    rates = []
    for batch, side, in_channels, out_channels, kernel in PEAK_CONVOLUTIONS:
        images = tf.cast(tf.random.normal([batch, side, side, in_channels]), dtype)
        weights = tf.cast(tf.random.normal([kernel, kernel, in_channels, out_channels]), dtype)
        convolve = tf.function(lambda images=images, weights=weights: tf.nn.conv2d(images, weights, 1, "SAME"))
        work = 2 * batch * side * side * in_channels * out_channels * kernel * kernel
        rates.append(work / _best_seconds(convolve, seconds / len(PEAK_CONVOLUTIONS)))
    return max(rates)


def memory_bandwidth(seconds: float = 2.0, elements: int = 1 << 25) -> float:
    """Bytes per second that one compiled elementwise pass (read a float32 tensor of `elements`, 128 MB by default,
    beyond the caches; write its double) moves on every core, the best of repeats for `seconds`: the rate at which
    memory-bound work (batch norm, activations, their gradients) can at best stream activations."""
    import tensorflow as tf

    values = tf.random.uniform([elements])
    doubled = tf.function(lambda: values * 2.0, jit_compile=True)
    first_of_doubled = tf.function(lambda: doubled()[:1])  # the whole pass runs; only one number is read back
    return 2 * 4 * elements / _best_seconds(first_of_doubled, seconds)


def peak_flops(dtype: str = "float32", seconds: float = 3.0) -> float:
    """This machine's peak in `dtype` as TensorFlow's kernels reach it: the better of the matrix product and the
    convolutions (the module docstring), measured now."""
    return max(matmul_peak_flops(dtype=dtype, seconds=seconds / 2), convolution_peak_flops(seconds / 2, dtype))
