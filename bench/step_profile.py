"""Where a training step's time goes: a preset's network at its batch, taken apart, with this CPU's peak measured in
the same run.

For each precision (float32, and bfloat16 where asked), seconds per step of, in turns:
- `convolutions`: forward and backward of the network with its batch norms and activations replaced by identities
  (the convolutions, the poolings and the head: what the FLOPs are);
- `forward`: the network's forward pass alone (training mode);
- `gradients`: forward and backward (the loss's gradients, no update);
- `sgd step`: gradients and a Nesterov SGD update of every variable;
- `recipe step`: gradients and the recipe's optimizer (Muon on the kernels for a Muon recipe): bench/timing.py's
  bare step;
- `loop`: the training loop, one worker (input pipeline, augmentation, label smoothing, weight decay, multipliers,
  finiteness checks, logging; summaries, checkpoints and validation at the cadence of the preset's whole run), from
  its progress windows;
and what each part costs: batch norm and activations (gradients - convolutions), the optimizer (recipe step -
gradients; and its update alone, timed on fixed gradients), the loop around the step (loop - recipe step). Every
part is the loop's steady state: a recipe whose whitening bias stops after `whitening_bias_epochs` has its loop timed
after that, and the bare parts take no gradient of it either.
Training FLOP/s = 3 x forward FLOPs x images/s, against the peak of the same precision (bench/flops.py: the best
of a matrix product and well-shaped convolutions), measured in each round. The memory-bound side is put the same
way: batch norm and activations' time as passes over the activations (every activation layer's output at the batch,
in the compute dtype: what each batch norm + GELU pair reads and writes) at the memory bandwidth measured in each
round (bench/flops.py); and the step's time at 0.8 of the peak beside its convolutions'.

    .venv/bin/python bench/step_profile.py [--preset fast] [--precisions float32 mixed_bfloat16] [--rounds 2]
        [--compiled-kernels auto off]    # the project's compiled kernels against TensorFlow's, in the same run

TensorFlow's inter-op threads are set once, at the start, as training sets them for the first mode: one op at a
time where the compiled kernel gradient runs (components/common/compiled_kernels.py's settle_op_threads).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from bench import flops, timing  # noqa: E402
from bench.accuracy import config_model_spec, full_training_set, whole_run_loop_seconds  # noqa: E402
from components.common import compiled_kernels  # noqa: E402

PARTS = ("convolutions", "forward", "gradients", "sgd step", "recipe step", "loop")


def without_normalization(model):
    """The same network with every batch norm and activation an identity: its convolutions, poolings and head."""
    import keras

    class Through(keras.layers.Layer):
        def call(self, inputs, training=None, mask=None):
            return inputs

    def clone(layer):
        normalizes = isinstance(layer, keras.layers.BatchNormalization)
        activates = isinstance(layer, keras.layers.Activation) and layer.get_config()["activation"] != "linear"
        if normalizes or activates:
            return Through(name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(model, clone_function=clone)


def activation_bytes(model, batch: int, dtype: str) -> int:
    """Bytes of every activation's output (an activation layer's, not the linear one of the logits, or a batch norm
    + GELU layer's) at `batch` in `dtype`: one pass over the tensors that the batch norms and activations read and
    write."""
    import math

    import keras
    import tensorflow as tf

    from components.common.model import BatchNormGelu

    def activates(layer) -> bool:
        if isinstance(layer, BatchNormGelu):
            return True
        return isinstance(layer, keras.layers.Activation) and layer.get_config()["activation"] != "linear"

    size = tf.dtypes.as_dtype(dtype).size
    return sum(batch * math.prod(layer.output.shape[1:]) * size for layer in model.layers if activates(layer))


def step_seconds(config, model, window_steps: int, windows: int, update=None, backward: bool = True) -> float:
    """Median seconds per step of forward (and backward, of the variables the loop's steady state computes
    gradients for, and `update`) on one fixed batch of the config's size (bench/timing.py)."""
    variables = timing.steady_variables(model, config)
    seconds = timing.bare_window_seconds(model, update, config.batch_size, window_steps, windows, backward, variables)
    return statistics.median(seconds)


def measure(config, part: str, window_steps: int, windows: int) -> float:
    """Seconds per step of one part (see the module docstring) for a TrainConfig."""
    import keras

    from components.common.model import build_model

    with precision_policy(config.precision):
        if part == "loop":
            return whole_run_loop_seconds(config, window_steps, windows)
        model = build_model(config_model_spec(config))
        if part == "convolutions":
            return step_seconds(config, without_normalization(model), window_steps, windows)
        if part == "forward":
            return step_seconds(config, model, window_steps, windows, backward=False)
        if part == "gradients":
            return step_seconds(config, model, window_steps, windows)
        if part == "sgd step":
            update = keras.optimizers.SGD(0.01, momentum=config.momentum, nesterov=True)
            return step_seconds(config, model, window_steps, windows, update)
        return step_seconds(config, model, window_steps, windows, recipe_update(config, model))


@contextlib.contextmanager
def precision_policy(precision: str):
    """Keras's global precision policy set to `precision` for the block, float32 again after it."""
    import keras

    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def recipe_update(config, model):
    """The recipe's optimizer in the bare step: Muon on the kernels (and SGD on the rest) for a Muon recipe."""
    import keras

    if config.optimizer == "muon":
        return timing.BareMuon(model.trainable_variables, config, learning_rate=0.01)
    return keras.optimizers.SGD(0.01, momentum=config.momentum, nesterov=config.nesterov)


def update_alone_seconds(config, window_steps: int, windows: int = 3) -> float:
    """Median seconds per call of the recipe's update by itself: `apply_gradients` on fixed gradients, no forward
    or backward, so what it costs apart from how it sits in the step around it."""
    import tensorflow as tf

    from components.common.model import build_model

    with precision_policy(config.precision):
        model = build_model(config_model_spec(config))
        update = recipe_update(config, model)
        gradients = [tf.random.normal(variable.shape, stddev=1e-3) for variable in model.trainable_variables]

        @tf.function
        def apply():
            update.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return tf.reduce_sum(model.trainable_variables[0])

        return statistics.median(timing.call_window_seconds(apply, window_steps, windows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fast")
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument(
        "--compiled-kernels", nargs="+", default=["auto"], choices=compiled_kernels.MODES,
        help="each part timed in each CIFAR10_PIPELINE_COMPILED_KERNELS mode given, in turn in each round",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=2)
    arguments = parser.parse_args()
    kernels_mode(arguments.compiled_kernels[0])
    print(timing.threads_as_training(arguments.precisions), flush=True)
    first, *others = arguments.compiled_kernels
    for mode in others:
        if one_op_at_a_time(mode, arguments.precisions) != one_op_at_a_time(first, arguments.precisions):
            print(f"  (as training sets them with compiled kernels {first}; with {mode} it sets them otherwise, "
                  f"so the loop's time with {mode} is not quite the training's)", flush=True)  # fmt: skip

    from components.common.config import config_from_mapping
    from components.common.model import build_model
    from components.train.config import TrainConfig

    data = full_training_set()
    base = config_from_mapping(TrainConfig, {"data": data, "model_dir": "unused", "preset": arguments.preset}, "bench")
    model = build_model(config_model_spec(base))
    forward_flops = flops.forward_flops(model, (32, 32, 3))
    modes = arguments.compiled_kernels
    for precision in arguments.precisions:
        config = dataclasses.replace(base, precision=precision)
        pass_bytes = activation_bytes(model, config.batch_size, flops.compute_dtype(precision))
        seconds: dict[tuple[str, str], list[float]] = {(mode, part): [] for mode in modes for part in PARTS}
        updates: dict[str, list[float]] = {mode: [] for mode in modes}
        peaks, bandwidths = [], []
        for round_number in range(1, arguments.rounds + 1):
            order = PARTS if round_number % 2 else tuple(reversed(PARTS))
            for mode in modes if round_number % 2 else tuple(reversed(modes)):
                kernels_mode(mode)
                for part in order:
                    seconds[mode, part].append(measure(config, part, arguments.window_steps, arguments.windows))
                    print(f"{precision}{mode_label(mode, modes)} round {round_number}: {part} "
                          f"{config.batch_size / seconds[mode, part][-1]:.0f} images/s", flush=True)  # fmt: skip
                updates[mode].append(update_alone_seconds(config, 10))
            peaks.append(flops.peak_flops(flops.compute_dtype(precision)))
            bandwidths.append(flops.memory_bandwidth())
        peak, bandwidth = max(peaks), max(bandwidths)
        loops = {}
        for mode in modes:
            median = {part: statistics.median(seconds[mode, part]) for part in PARTS}
            loops[mode] = median["loop"]
            print(f"\n{arguments.preset} in {precision}{mode_label(mode, modes)}, batch {config.batch_size}, "
                  f"{forward_flops / 1e6:.0f} MFLOP per image forward; peak {peak / 1e9:.0f} GFLOP/s "
                  f"({arguments.rounds} rounds)")  # fmt: skip
            report(median, statistics.median(updates[mode]), config.batch_size, forward_flops, peak)
            print(memory_bound_summary(median["gradients"] - median["convolutions"], pass_bytes, bandwidth))
            at_peak = 3 * forward_flops * config.batch_size / peak
            print(f"  a step's FLOPs at the peak: {1000 * at_peak:.0f} ms; at 0.8 of it: {1000 * at_peak / 0.8:.0f} "
                  f"ms, where the convolutions alone take {1000 * median['convolutions']:.0f}\n",
                  flush=True)  # fmt: skip
        for mode in modes[1:]:
            print(f"{precision}: the loop with compiled kernels {modes[0]} / {mode}: "
                  f"{loops[mode] / loops[modes[0]]:.2f}x the images/s\n", flush=True)  # fmt: skip


def kernels_mode(mode: str) -> None:
    """The compiled kernels as CIFAR10_PIPELINE_COMPILED_KERNELS=`mode` says, for the models built from here on."""
    os.environ[compiled_kernels.MODE_VARIABLE] = mode
    compiled_kernels.forget()


def one_op_at_a_time(mode: str, precisions: list[str]) -> bool:
    """Whether training in any of `precisions` sets TensorFlow's inter-op threads to 1 with compiled kernels
    `mode`."""
    from components.train.precision import resolve

    kernels_mode(mode)
    return any(compiled_kernels.one_op_at_a_time(resolve(precision)) for precision in precisions)


def mode_label(mode: str, modes: list[str]) -> str:
    return f", compiled kernels {mode}" if len(modes) > 1 else ""


def report(median: dict[str, float], update_alone: float, batch: int, forward_flops: float, peak: float) -> None:
    """The parts' table and what each costs, from each part's median seconds per step."""
    print("| part | ms per step | images/s | training GFLOP/s (of peak) |")
    print("|---|---|---|---|")
    for part in PARTS:
        rate = batch / median[part]
        work = (1 if part == "forward" else 3) * forward_flops * rate
        print(f"| {part} | {1000 * median[part]:.0f} | {rate:.0f} | {work / 1e9:.0f} ({work / peak:.0%}) |")
    costs = {
        "batch norm and activations (gradients - convolutions)": median["gradients"] - median["convolutions"],
        "the optimizer's update (recipe step - gradients)": median["recipe step"] - median["gradients"],
        "  of it, the update by itself (on fixed gradients)": update_alone,
        "the loop around the step (loop - recipe step)": median["loop"] - median["recipe step"],
    }
    for what, cost in costs.items():
        print(f"  {what}: {1000 * cost:.0f} ms per step ({cost / median['loop']:.0%} of the loop's)")
    print(f"  loop / bare recipe step: {median['recipe step'] / median['loop']:.2f}")


def memory_bound_summary(seconds: float, pass_bytes: int, bandwidth: float) -> str:
    """Batch norm and activations' `seconds` as passes of `pass_bytes` at `bandwidth` bytes/s."""
    one_pass = pass_bytes / bandwidth
    return (
        f"  memory bandwidth {bandwidth / 1e9:.1f} GB/s; one pass over the activations ({pass_bytes / 1e6:.0f} MB) "
        f"takes {1000 * one_pass:.1f} ms, so batch norm and activations' {1000 * seconds:.0f} ms are "
        f"{seconds / one_pass:.0f} passes"
    )


if __name__ == "__main__":
    main()
