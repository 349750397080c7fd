"""How the training-speed benchmarks time a step: in windows of consecutive steps, after one window of warm-up
(tracing), for the training loop (its own progress lines) and for the baseline, a bare `tf.function` step
(forward, loss, gradients, `apply_gradients`) of a model and optimizer on one fixed random batch."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import statistics
import tempfile
import time
from collections.abc import Callable

RATE = re.compile(r"step \d+/\d+ .* ([\d.]+) examples/s")


def threads_as_training(precisions: list[str]) -> str:
    """TensorFlow's op threads set as the training sets them in `precisions` (components/common/compiled_kernels.py's
    settle_op_threads: one op at a time where the compiled kernels run) when every precision timed is the
    same one; call it before TensorFlow runs an op. Returns what they are, for the benchmark to print."""
    import tensorflow as tf

    from components.common.compiled_kernels import settle_op_threads
    from components.train.precision import resolve

    resolved = {resolve(precision) for precision in precisions}
    if len(resolved) == 1:
        settle_op_threads(resolved.pop())
    inter_op = tf.config.threading.get_inter_op_parallelism_threads()
    return f"TensorFlow's inter-op threads: {inter_op or 'its default (one per core)'}"


def steady_variables(model, config) -> list:
    """The variables whose gradients the training loop computes in its steady state: the model's trainable ones, but
    the whitening bias when the recipe stops it after `whitening_bias_epochs` (components/train/step.py)."""
    from components.common.model import variable_name
    from components.train.step import WHITENING_BIAS

    stops = bool(getattr(config, "whitening_bias_epochs", None))
    return [v for v in model.trainable_variables if not (stops and variable_name(v) == WHITENING_BIAS)]


def bare_window_seconds(
    model, optimizer, batch: int, window_steps: int, windows: int, backward: bool = True, variables=None
) -> list[float]:
    """Seconds per step of the bare step in each of `windows` consecutive windows of `window_steps` steps, its
    gradients those of `variables` (default: the model's trainable ones). With no `optimizer` the step ends at the
    gradients (their sum is returned, so that none is pruned); with no `backward`, at the loss."""
    import tensorflow as tf

    variables = model.trainable_variables if variables is None else variables

    images = tf.cast(tf.random.uniform([batch, 32, 32, 3], 0, 256, dtype=tf.int32), tf.uint8)
    labels = tf.random.uniform([batch], 0, 10, dtype=tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        if not backward:
            return loss
        gradients = tape.gradient(loss, variables)
        if optimizer is None:
            return tf.add_n([tf.reduce_sum(tf.cast(gradient, tf.float32)) for gradient in gradients]) + loss
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return loss

    return call_window_seconds(step, window_steps, windows)


def call_window_seconds(function, window_steps: int, windows: int) -> list[float]:
    """Seconds per call of `function` (a tf.function returning a tensor) in each of `windows` consecutive windows
    of `window_steps` calls, after one window that traces and warms up; each window ends by reading the last
    result, so the calls it timed have run."""

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(window_steps):
            result = function()
        float(result)
        return (time.perf_counter() - start) / window_steps

    timed()  # trace and warm up
    return [timed() for _ in range(windows)]


class BareMuon:
    """The bare step's optimizer for a Muon recipe (`apply_gradients` as Keras's): the loop's Muon step on the
    convolution kernels, SGD on the rest; fixed rates."""

    def __init__(self, variables, config, learning_rate: float):
        import keras
        import tensorflow as tf

        from components.train import optimization

        self.config = config
        self.is_kernel = optimization.is_muon_variable
        self.sgd = keras.optimizers.SGD(learning_rate, momentum=config.momentum, nesterov=config.nesterov)
        self.sgd.build([variable for variable in variables if not self.is_kernel(variable)])
        self.buffers = {id(variable): tf.Variable(tf.zeros_like(variable)) for variable in variables
                        if self.is_kernel(variable)}  # fmt: skip

    def apply_gradients(self, pairs) -> None:
        from components.train import optimization

        config, others = self.config, []
        for gradient, variable in pairs:
            if self.is_kernel(variable):
                optimization.apply_muon(variable, self.buffers[id(variable)], gradient, config.muon_learning_rate,
                                        config.muon_momentum, config.nesterov, config.newton_schulz_steps)  # fmt: skip
            else:
                others.append((gradient, variable))
        self.sgd.apply_gradients(others)


def loop_window_seconds(
    config, window_steps: int, windows: int, run_steps: int | None = None, warm_up_steps: int = 0
) -> list[float]:
    """Seconds per step of the whole training loop, in-process, for `config` (a TrainConfig; its model directory
    and length are replaced) in each of `windows` progress windows after the first (which traces) and after
    `warm_up_steps` more (rounded up to whole windows: the steps before the loop's steady state, such as the
    whitening bias's, after which the step is traced again), from its progress lines.
    `run_steps`: the length of the run the windows stand for, whose cadence of summaries, histograms, checkpoints
    and validation they keep (default: the cadence of the windows' own short run)."""
    from components.train import cadence
    from components.train.loop import Trainer

    kept = cadence.resolve(config, run_steps) if run_steps else None
    skipped = 1 + math.ceil(warm_up_steps / window_steps)  # windows before the timed ones

    rates: list[float] = []

    class ProgressRates(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = RATE.search(record.getMessage())
            if found:
                rates.append(float(found.group(1)))

    loop_logger = logging.getLogger("components.train.loop")
    handler, level = ProgressRates(), loop_logger.level
    loop_logger.addHandler(handler)
    loop_logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as model_dir:
        config = dataclasses.replace(
            config,
            model_dir=model_dir,
            epochs=None,
            train_steps=window_steps * (windows + skipped),
            log_every_steps=window_steps,
            checkpoint_every_seconds=3600,
        )
        if kept:
            config = dataclasses.replace(
                config,
                summary_every_steps=kept.summary,
                histogram_every_steps=kept.histogram,
                checkpoint_every_steps=kept.checkpoint,
                validation_every_steps=kept.validation,
            )
        trainer = Trainer(config)
        try:
            trainer.run()
        finally:
            trainer.close()
            loop_logger.removeHandler(handler)
            loop_logger.setLevel(level)
    return [config.batch_size / rate for rate in rates[skipped:]]


def paired_round(
    round_number: int, bare: Callable[[], list[float]], loop: Callable[[], list[float]]
) -> tuple[float, float]:
    """One round of a comparison: the median seconds per step of the bare step and of the loop; odd rounds start
    with the bare step, even ones with the loop, so that neither side always runs on a fresh machine."""
    sides = {"bare": bare, "loop": loop}
    order = ("bare", "loop") if round_number % 2 else ("loop", "bare")
    seconds = {side: statistics.median(sides[side]()) for side in order}
    return seconds["bare"], seconds["loop"]
