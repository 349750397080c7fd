"""Training summaries for TensorBoard: scalars, histograms, input images, a profiler trace, the config as text."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from components.common import filesystem
from components.common.model import variable_name
from components.common.model_directory import TRAIN_LOGS, VALIDATION_LOGS
from components.train.config import TrainConfig


class Summaries:
    """TensorBoard summaries under the model directory: `train/` and `validation/` (two runs, so TensorBoard draws
    their curves on the same charts); only the chief writes them.

    With a remote model directory (`publish` given), event files are written to a local staging folder and, at
    every summary interval, the current files are closed, moved into the mirror and published: summaries appear in
    the object store at least every summary interval, and each event file is uploaded once, whole (objects cannot
    be appended to). TensorBoard reads a folder's files in order, as one stream.
    """

    def __init__(self, model_directory: Path, enabled: bool, config: TrainConfig, publish=None):
        self.enabled = enabled
        self.config = config
        self.model_directory = model_directory
        self.publish = publish
        self.staging = filesystem.scratch_directory("summaries") if enabled and publish else model_directory
        self.writers: dict = {}  # run -> its event file's writer, opened at the run's first summary
        self.profiling = False

    @property
    def writer(self):
        return self._writer(TRAIN_LOGS)

    def _writer(self, run: str):
        if run not in self.writers:
            self.writers[run] = tf.summary.create_file_writer(str(self.staging / run))
        return self.writers[run]

    def _rotate(self) -> None:
        """Close the current event files, move what the staging folder holds into the mirror, publish it."""
        if self.staging == self.model_directory or self.profiling:
            return
        for writer in self.writers.values():
            writer.close()
        for path in sorted(self.staging.rglob("*")):
            if path.is_file():
                target = self.model_directory / path.relative_to(self.staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(target))
        self.publish()
        self.writers = {}

    def config_text(self, text: str) -> None:
        if self.enabled:
            with self.writer.as_default():
                tf.summary.text("config", f"```\n{text}\n```", step=0)

    def scalars(self, host: dict, step: int) -> None:
        if not self.enabled:
            return
        with self.writer.as_default(step=step):
            for key in ("loss", "cross_entropy", "accuracy", "learning_rate", "gradient_norm", "examples_per_second"):
                if key in host:
                    tf.summary.scalar(key, float(np.asarray(host[key])))
            if self.config.precision == "mixed_float16":
                tf.summary.scalar("loss_scale", float(host["loss_scale"]))
        self.writer.flush()
        self._rotate()

    def validation(self, measured: dict[str, float], step: int) -> None:
        """The validation split's loss and accuracy, under the same tags as training's."""
        if not self.enabled:
            return
        writer = self._writer(VALIDATION_LOGS)
        with writer.as_default(step=step):
            for key, value in measured.items():
                tf.summary.scalar(key, value)
        writer.flush()

    def histograms(self, model, step: int) -> None:
        if not self.enabled:
            return
        with self.writer.as_default(step=step):
            for variable in model.variables:
                tf.summary.histogram(variable_name(variable), variable.numpy())
        self.writer.flush()

    def images(self, batch, strategy, count: int, step: int) -> None:
        if not self.enabled or count <= 0:
            return
        images = strategy.experimental_local_results(batch[0])[0][:count]
        with self.writer.as_default(step=step):
            tf.summary.image("augmented_inputs", images, max_outputs=count)

    def maybe_profile(self, step: int) -> None:
        if not self.enabled or not self.config.profile_steps:
            return
        first, last = self.config.profile_steps
        if step == first and not self.profiling:
            tf.profiler.experimental.start(str(self.staging / TRAIN_LOGS))
            self.profiling = True
        elif step == last + 1 and self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False

    def close(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False
        if not self.enabled:
            return
        self._rotate()
        for writer in self.writers.values():
            writer.close()
        if self.staging != self.model_directory:
            shutil.rmtree(self.staging, ignore_errors=True)
