"""The compiled batch norm + GELU (components/common/kernels/batch_norm_gelu.cc) against the two layers it replaces
(oneDNN's fused batch norm, then the GELU as one XLA kernel each way: `BatchNormGelu`'s own code where the compiled
op is not taken), in training, forward and backward, at each of a preset's `BatchNormGelu` layers at its batch in
bfloat16, in the same process run in alternating order; prints each one's milliseconds, as passes over the layer's
activations at the memory bandwidth measured in the same run (bench/flops.py), and the compiled op's speed-up. On a
CPU with AMX, where training takes the compiled batch norm + GELU without having been timed there, this is the
measurement that says whether it should.

    .venv/bin/python bench/batch_norm_gelu.py [--preset fast] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from bench import flops, timing  # noqa: E402
from bench.accuracy import config_model_spec, full_training_set  # noqa: E402
from bench.step_profile import precision_policy  # noqa: E402

WAYS = ("compiled", "two layers")


def forward_and_backward(layer, inputs, upstream, compiled: bool):
    """A tf.function of the layer's training forward and backward (to its input and offset, `upstream` the output's
    gradient), the compiled op's way or the two layers' way, returning one value of the input gradient."""
    import tensorflow as tf

    from components.common.model import FusedBatchNormalization, _gelu

    def apply(images):
        if compiled:
            return layer(images, training=True)
        return _gelu(FusedBatchNormalization.call(layer, images, training=True), True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = apply(inputs)
        input_gradient, offset_gradient = tape.gradient(outputs, [inputs, layer.beta], output_gradients=upstream)
        return tf.cast(input_gradient[0, 0, 0, 0], tf.float32) + offset_gradient[0]

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fast")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=5)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the compiled kernels say whether they run
    print(timing.threads_as_training(["mixed_bfloat16"]), flush=True)

    import tensorflow as tf

    from components.common import compiled_kernels
    from components.common.config import config_from_mapping
    from components.common.model import BatchNormGelu, build_model
    from components.train.config import TrainConfig

    if compiled_kernels.batch_norm_gelu_ops() is None:
        print("the compiled batch norm + GELU does not run here (said above): nothing to time", flush=True)
        return
    base = config_from_mapping(
        TrainConfig, {"data": full_training_set(), "model_dir": "unused", "preset": arguments.preset}, "bench"
    )
    batch = base.batch_size
    with precision_policy("mixed_bfloat16"):
        model = build_model(config_model_spec(base))
    bandwidth = flops.memory_bandwidth()
    print(f"\n{arguments.preset}'s batch norm + GELU layers in bfloat16 training, batch {batch}; memory bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s")  # fmt: skip
    print("| layer | image, channels | compiled ms (passes) | two layers ms (passes) | compiled's speed-up |")
    print("|---|---|---|---|---|")
    totals = dict.fromkeys(WAYS, 0.0)
    for layer in (layer for layer in model.layers if isinstance(layer, BatchNormGelu)):
        _, height, width, channels = layer.input.shape
        inputs = tf.cast(tf.random.normal([batch, height, width, channels]) * 2 + 0.5, tf.bfloat16)
        upstream = tf.cast(tf.random.normal([batch, height, width, channels]), tf.bfloat16)
        steps = {way: forward_and_backward(layer, inputs, upstream, way == "compiled") for way in WAYS}
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        for round_number in range(1, arguments.rounds + 1):
            for way in WAYS if round_number % 2 else reversed(WAYS):
                seconds[way] += timing.call_window_seconds(steps[way], arguments.window_steps, 2)
        median = {way: statistics.median(values) for way, values in seconds.items()}
        one_pass = batch * height * width * channels * 2 / bandwidth  # the activations in bfloat16, read or written
        cells = " | ".join(f"{1000 * median[way]:.1f} ({median[way] / one_pass:.1f})" for way in WAYS)
        print(f"| {layer.name} | {height}x{width}, {channels} | {cells} | "
              f"{median['two layers'] / median['compiled']:.2f}x |", flush=True)  # fmt: skip
        for way in WAYS:
            totals[way] += median[way]
    print(f"all of them: compiled {1000 * totals['compiled']:.1f} ms, two layers {1000 * totals['two layers']:.1f} "
          f"ms: {totals['two layers'] / totals['compiled']:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
