"""A preset's convolutions one by one, at its batch: forward, input gradient and kernel gradient (oneDNN's; one
matrix product per kernel tap, components/common/model.py's `_filter_gradient_by_taps`, over chunks of the batch as
the layer takes it and over the whole batch at once; and, in bfloat16 where this CPU runs it, the project's compiled
kernel, components/common/compiled_kernels.py), timed in the same process run in alternating order, with the peak
of the precision (bench/flops.py); prints each one's GFLOP/s, the taps' and the compiled kernel's speed-up over
oneDNN's kernel gradient and the chunks' over the whole batch, and which one the network's layer takes in training.

    .venv/bin/python bench/convolutions.py [--preset cifar10_speedrun] [--precisions mixed_bfloat16 float32]
"""

from __future__ import annotations

import argparse
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

WHOLE_BATCH = 2**62  # a chunk size no batch reaches
PASSES = ("forward", "input gradient", "kernel gradient", "kernel gradient by taps", "by taps, the whole batch")
COMPILED = "kernel gradient, compiled"


def convolution_passes(inputs, kernel, upstream) -> dict:
    """The passes of a stride-1 'same' convolution as tf.functions returning one value of their result (a scalar
    for bench/timing.py; the whole pass still runs)."""
    import tensorflow as tf

    from components.common.compiled_kernels import kernel_gradient_op
    from components.common.model import (
        COMPILED_OUT_CHANNELS_MULTIPLE,
        _compiled_filter_gradient,
        _filter_gradient_by_taps,
    )

    strides = [1, 1, 1, 1]

    def timed(compute):
        return tf.function(lambda: tf.cast(tf.reshape(compute(), [-1])[0], tf.float32))

    compiled = {}
    fits = inputs.dtype == tf.bfloat16 and kernel.shape[-1] % COMPILED_OUT_CHANNELS_MULTIPLE == 0
    if fits and kernel_gradient_op() is not None:
        compiled[COMPILED] = timed(lambda: _compiled_filter_gradient(inputs, upstream, kernel.shape))
    return {
        **compiled,
        "forward": timed(lambda: tf.nn.conv2d(inputs, kernel, 1, "SAME")),
        "input gradient": timed(
            lambda: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.shape(inputs), filter=kernel, out_backprop=upstream, strides=strides, padding="SAME"
            )
        ),
        "kernel gradient": timed(
            lambda: tf.raw_ops.Conv2DBackpropFilter(
                input=inputs, filter_sizes=tf.shape(kernel), out_backprop=upstream, strides=strides, padding="SAME"
            )
        ),
        "kernel gradient by taps": timed(lambda: _filter_gradient_by_taps(inputs, upstream, kernel.shape)),
        "by taps, the whole batch": timed(
            lambda: _filter_gradient_by_taps(inputs, upstream, kernel.shape, chunk_bytes=WHOLE_BATCH)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cifar10_speedrun")
    parser.add_argument("--precisions", nargs="+", default=["mixed_bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-steps", type=int, default=3)
    arguments = parser.parse_args()

    import keras
    import tensorflow as tf

    from components.common.config import config_from_mapping
    from components.common.model import build_model
    from components.train.config import TrainConfig

    base = config_from_mapping(
        TrainConfig, {"data": full_training_set(), "model_dir": "unused", "preset": arguments.preset}, "bench"
    )
    batch = base.batch_size
    for precision in arguments.precisions:
        dtype = flops.compute_dtype(precision)
        with precision_policy(precision):
            model = build_model(config_model_spec(base))
        layers = [  # the stride-1 ones (the per-tap kernel gradient is for those)
            layer
            for layer in model.layers
            if isinstance(layer, keras.layers.Conv2D) and tuple(layer.strides) == (1, 1) and layer.padding == "same"
        ]
        print(f"\n{arguments.preset} in {precision}, batch {batch}; peak {flops.peak_flops(dtype) / 1e9:.0f} GFLOP/s")
        table = (*PASSES, COMPILED)
        print("| convolution | image, channels | " + " | ".join(f"{name} ms (GFLOP/s)" for name in table)
              + " | taps' speed-up | compiled's speed-up | chunks' speed-up | the layer takes |")  # fmt: skip
        print("|---|---|" + "---|" * len(table) + "---|---|---|---|")
        for layer in layers:
            _, height, width, in_channels = layer.input.shape
            rows, columns, _, out_channels = layer.kernel.shape
            inputs = tf.cast(tf.random.normal([batch, height, width, in_channels]), dtype)
            kernel = tf.cast(tf.random.normal([rows, columns, in_channels, out_channels]) * 0.05, dtype)
            upstream = tf.cast(tf.random.normal([batch, height, width, out_channels]), dtype)
            passes = convolution_passes(inputs, kernel, upstream)
            seconds: dict[str, list[float]] = {name: [] for name in passes}
            for round_number in range(1, arguments.rounds + 1):
                for name in list(passes) if round_number % 2 else reversed(list(passes)):
                    seconds[name] += timing.call_window_seconds(passes[name], arguments.window_steps, 2)
            median = {name: statistics.median(values) for name, values in seconds.items()}
            work = 2 * batch * height * width * in_channels * out_channels * rows * columns
            cells = " | ".join(
                f"{1000 * median[name]:.1f} ({work / median[name] / 1e9:.0f})" if name in median else "-"
                for name in table
            )
            choose = getattr(layer, "_kernel_gradient", None)  # a SmallImageConv2D's choice
            taken = {"taps": "taps", "compiled": "compiled"}.get(choose and choose(inputs, training=True), "oneDNN's")
            speed_up = median["kernel gradient"] / median["kernel gradient by taps"]
            compiled_speed_up = f"{median['kernel gradient'] / median[COMPILED]:.2f}x" if COMPILED in median else "-"
            chunks_speed_up = median["by taps, the whole batch"] / median["kernel gradient by taps"]
            print(f"| {layer.name} | {height}x{width}, {in_channels}->{out_channels} | {cells} | {speed_up:.2f}x "
                  f"| {compiled_speed_up} | {chunks_speed_up:.2f}x | {taken} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
