"""The training loop: the seeds' `create_train_op` and `train`, rebuilt on TF2 mechanisms.

One step, on every replica: forward, loss scaled by the global batch (plus L2 on kernels), gradients,
one all-reduce of the gradients together with the loss, accuracy and the workers' flags (stop requested,
checkpoint due), gradient processing on the global gradient, then the optimizer's per-variable update
through `merge_call`. Every replica computes identical updates, so every worker ends with identical weights.

Around it: check numerics (a NaN/Inf loss or gradient stops training with an error naming the step, and
that state is never checkpointed), checkpoints by steps and/or seconds (only the chief writes to the model
directory), resume from the newest readable checkpoint, SIGTERM handling (a checkpoint at a step all
workers agree on, then exit code 143), warm start, exponential moving average, TensorBoard summaries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from components.common import storage
from components.common.config import config_to_dict
from components.common.dataset import open_dataset
from components.common.model_directory import RESOLVED_CONFIG, TRAIN_METRICS
from components.common.progress import format_duration
from components.train import checkpoints, data, distribution, optimization
from components.train.config import TrainConfig, parse_assignments
from components.train.model import ModelSpec, build_model, is_kernel, variable_name
from components.train.termination import Termination

logger = logging.getLogger(__name__)

# What makes a checkpoint another model: resuming with a different value cannot restore it.
ARCHITECTURE_FIELDS = ("model", "depth", "width_multiplier", "num_classes")
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH_STEPS = 2000


class NumericsError(RuntimeError):
    """The loss or a gradient became NaN or Inf."""


@dataclass(frozen=True)
class TrainResult:
    model_dir: str
    step: int
    total_steps: int
    checkpoint: str | None
    metrics: dict
    weights_sha256: str
    preempted: bool = False
    chief: bool = True


def cross_entropy(labels: tf.Tensor, logits: tf.Tensor, num_classes: int, label_smoothing: float) -> tf.Tensor:
    """Per-example softmax cross-entropy, with optional label smoothing."""
    targets = tf.one_hot(labels, num_classes)
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
    return tf.nn.softmax_cross_entropy_with_logits(targets, tf.cast(logits, tf.float32))


def _weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for variable in sorted(model.variables, key=variable_name):
        digest.update(variable_name(variable).encode())
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def _set_precision(precision: str) -> None:
    keras.mixed_precision.set_global_policy("float32" if precision == "float32" else precision)


class Trainer:
    """Builds everything once; `run()` trains to the planned step."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.termination = Termination().install()  # from here on, a SIGTERM is never lost
        keras.utils.set_random_seed(config.seed)
        _set_precision(config.precision)
        self.cluster = distribution.cluster_from_environment(config.workers)
        self.chief = self.cluster is None or self.cluster.is_chief
        self.model_directory = checkpoints.ModelDirectory(config.model_dir, config.cache_dir)
        self.write_dir: Path | None = None  # where this worker writes: the model directory, or scratch
        if self.chief:
            self.model_directory.claim_writer()  # before anything else: a second writer fails at once
        try:
            self._set_up(config)
        except BaseException:
            self.close()
            raise

    def _set_up(self, config: TrainConfig) -> None:
        check = self.termination.check
        if self.cluster is not None and self.cluster.size > 1:
            distribution.wait_for_peers(self.cluster, config.peer_timeout_seconds, lambda: check("waiting for peers"))
        with self.termination.held():  # TensorFlow installs its own SIGTERM handler here
            self.strategy = distribution.create_strategy(self.cluster)
        check("after forming the cluster")
        self.dataset = open_dataset(config.data, splits=("train",), cache_dir=config.cache_dir)
        manifest = self.dataset.manifest
        self.num_classes = manifest.num_classes
        self.train_examples = manifest.splits["train"].num_examples
        if not self.train_examples:
            raise ValueError(f"data: {config.data} has no training examples (its train split is empty)")
        self.steps_per_epoch = self.train_examples / config.batch_size
        self.total_steps = config.total_steps(self.train_examples)
        check("after opening the dataset")
        self.model_directory.pull()
        self.write_dir = self.model_directory.local if self.chief else storage.scratch_directory(self.cluster.name)
        self._build()
        check("after building the model")

    def close(self) -> None:
        """End this attempt: the model directory's writer lock, a worker's scratch copy, the SIGTERM handler."""
        self.model_directory.release_writer()
        if self.write_dir is not None and self.write_dir != self.model_directory.local:
            shutil.rmtree(self.write_dir, ignore_errors=True)
        self.termination.uninstall()

    # -- construction ---------------------------------------------------------------------------------------

    def _build(self) -> None:
        config = self.config
        spec = ModelSpec(
            depth=config.depth,
            width_multiplier=config.width_multiplier,
            num_classes=self.num_classes,
            data_format=config.data_format,
            batch_norm_decay=config.batch_norm_decay,
            batch_norm_epsilon=config.batch_norm_epsilon,
            image_shape=tuple(self.dataset.manifest.image_shape),
        )
        with self.strategy.scope():
            self.model = build_model(config.model, spec)
            self.trained, _frozen = optimization.select_trainable(
                self.model.trainable_variables, config.trainable, config.frozen
            )
            self.optimizer = optimization.make_optimizer(config)
            self.optimizer.build(self.trained)
            self.step = tf.Variable(
                0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA, name="step"
            )
            self.loss_scale = tf.Variable(
                INITIAL_LOSS_SCALE if config.precision == "mixed_float16" else 1.0,
                trainable=False,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                name="loss_scale",
            )
            self.finite_steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
            )
            self.ema = {}
            if config.ema_decay:
                for variable in self.trained:
                    self.ema[variable_name(variable)] = tf.Variable(
                        variable.value, trainable=False, name=f"ema_{variable_name(variable).replace('/', '_')}"
                    )
        self.decayed = [variable for variable in self.trained if is_kernel(variable)]
        self.moving_statistics = list(self.model.non_trainable_variables)
        self.processing = optimization.GradientProcessing.for_variables(config, self.trained)
        self.schedule = optimization.make_schedule(config, self.steps_per_epoch, self.total_steps)
        self.state = checkpoints.TrainingState(self.model, self.optimizer, self.step, self.ema)
        self.checkpoint = self.state.checkpoint()
        if self.chief:
            checkpoints.reconcile_state_file(self.model_directory.local)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(self.write_dir),
            max_to_keep=config.max_to_keep,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_hours,
            checkpoint_name=checkpoints.CHECKPOINT_PREFIX,
        )

    # -- the step -------------------------------------------------------------------------------------------

    def _forward_backward(self, images, labels):
        """Loss, cross-entropy sum, correct count and gradients of this replica (XLA-compiled on request)."""
        config = self.config
        with tf.GradientTape() as tape:
            logits = self.model(data.normalize(images), training=True)
            per_example = cross_entropy(labels, logits, self.num_classes, config.label_smoothing)
            loss = tf.reduce_sum(per_example) / config.batch_size
            if config.optimizer != "adamw" and config.weight_decay and self.decayed:
                l2 = tf.add_n([tf.nn.l2_loss(tf.cast(variable, tf.float32)) for variable in self.decayed])
                loss += config.weight_decay * l2 / self.strategy.num_replicas_in_sync
            scaled = loss * self.loss_scale
        gradients = tape.gradient(scaled, self.trained)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32))
        return loss, tf.reduce_sum(per_example), correct, gradients

    def _replica_step(self, batch, local_flags):
        config = self.config
        images, labels = batch
        context = tf.distribute.get_replica_context()
        loss, cross_entropy_total, correct, gradients = self._compute(images, labels)
        # Batch-norm moving statistics were just updated from this replica's batch; averaging them across
        # replicas makes every worker hold the update of the averaged batch statistics, as shared variables did.
        statistics = [tf.cast(tf.identity(variable.value), tf.float32) for variable in self.moving_statistics]
        summed = context.all_reduce(
            tf.distribute.ReduceOp.SUM,
            [tf.cast(gradient, tf.float32) for gradient in gradients]
            + statistics
            + [loss, cross_entropy_total, correct, tf.cast(local_flags, tf.float32)],
        )
        count = len(gradients)
        gradients = [gradient / self.loss_scale for gradient in summed[:count]]
        replicas = float(self.strategy.num_replicas_in_sync)
        statistics = [total / replicas for total in summed[count : count + len(statistics)]]
        total_loss, cross_entropy_sum, correct_sum, flags = summed[count + len(statistics) :]
        gradients_finite = optimization.all_finite(gradients)
        loss_finite = tf.math.is_finite(total_loss)
        processed, gradient_norm = self.processing(gradients)
        rate = self.schedule(self.step)
        apply = gradients_finite & loss_finite
        context.merge_call(self._apply, args=(processed, rate, apply, gradients_finite, statistics))
        # The state after the update, as a checkpoint would hold it: a finite loss and gradient can still make
        # Inf weights or batch-norm variances (a huge learning rate). Every worker holds the same state.
        state = [tf.cast(variable.value, tf.float32) for variable in self.model.variables]
        state += [tf.cast(shadow, tf.float32) for shadow in self.ema.values()]
        return {
            "state_finite": optimization.all_finite(state),
            "loss": total_loss,
            "cross_entropy": cross_entropy_sum / config.batch_size,
            "accuracy": correct_sum / config.batch_size,
            "gradient_norm": gradient_norm,
            "learning_rate": rate,
            "loss_finite": loss_finite,
            "gradients_finite": gradients_finite,
            "flags": flags,
            "loss_scale": self.loss_scale.read_value() * 1.0,
        }

    def _apply(self, strategy, gradients, rate, apply, gradients_finite, statistics):
        """Cross-replica: apply the (identical) processed gradients to each replica's copy of the variables."""
        config = self.config
        for variable, value in zip(self.moving_statistics, statistics, strict=True):
            strategy.extended.update(
                variable.value, lambda held, new: held.assign(tf.cast(new, held.dtype)), args=(value,), group=False
            )
        skip_allowed = config.precision == "mixed_float16"  # an fp16 overflow skips the step and lowers the scale

        def update(variable, gradient, decoupled_decay):
            if skip_allowed:
                return tf.cond(
                    apply,
                    lambda: self._update_variable(variable, gradient, rate, decoupled_decay),
                    lambda: tf.constant(True),
                )
            return self._update_variable(variable, gradient, rate, decoupled_decay)

        decoupled = config.optimizer == "adamw" and bool(config.weight_decay)
        for gradient, variable in zip(gradients, self.trained, strict=True):
            strategy.extended.update(
                variable.value, update, args=(gradient, decoupled and is_kernel(variable)), group=False
            )
        self.optimizer.iterations.assign_add(1)
        self.step.assign_add(1)
        if skip_allowed:  # dynamic loss scaling: halve on overflow, double after a run of finite steps
            zero = tf.zeros([], tf.int64)
            streak = tf.where(gradients_finite, self.finite_steps + 1, zero)
            grow = streak >= LOSS_SCALE_GROWTH_STEPS
            shrunk = tf.maximum(self.loss_scale / 2.0, 1.0)
            self.loss_scale.assign(
                tf.where(gradients_finite, tf.where(grow, self.loss_scale * 2.0, self.loss_scale), shrunk)
            )
            self.finite_steps.assign(tf.where(grow, zero, streak))
        if self.ema:
            decay = config.ema_decay
            for variable in self.trained:
                shadow = self.ema[variable_name(variable)]
                strategy.extended.update(
                    shadow, lambda s, v: s.assign(decay * s + (1.0 - decay) * v), args=(variable.value,), group=False
                )

    def _update_variable(self, variable, gradient, rate, decoupled_decay: bool):
        gradient = tf.cast(gradient, variable.dtype)
        if decoupled_decay:  # AdamW: weight decay applied to the weights, not through the gradient
            variable.assign_sub(variable * tf.cast(self.config.weight_decay * rate, variable.dtype))
        self.optimizer.update_step(gradient, variable, tf.cast(rate, variable.dtype))
        return tf.constant(True)

    def _make_step_function(self):
        def step_function(iterator, local_flags):
            batch = next(iterator)
            outputs = self.strategy.run(self._replica_step, args=(batch, local_flags))
            return {key: self.strategy.experimental_local_results(value)[0] for key, value in outputs.items()}, batch

        self._compute = (
            tf.function(self._forward_backward, jit_compile=True) if self.config.xla else self._forward_backward
        )
        return tf.function(step_function)

    # -- start: resume or warm start -------------------------------------------------------------------------

    def _start(self) -> int:
        restored = checkpoints.restore_latest(self.checkpoint, self.model_directory.local)
        if restored is not None:
            step = int(self.step.numpy())
            logger.info("resuming from %s at step %d", restored, step)
            if self.config.warm_start:
                logger.info("not warm-starting: the model directory already has checkpoints")
            return step
        if self.config.warm_start:
            checkpoints.warm_start(
                self.model.variables,
                self.config.warm_start,
                tuple(self.config.warm_start_include),
                tuple(self.config.warm_start_exclude),
                parse_assignments(self.config.warm_start_map, "warm_start_map"),
                self.config.cache_dir,
            )
            for variable in self.trained:
                if self.ema:
                    self.ema[variable_name(variable)].assign(variable.value)
        logger.info("starting from step 0")
        return 0

    def _check_model_directory_fits(self) -> list[str]:
        """Before anything is written: a model directory that holds checkpoints must hold this model, trained on
        this dataset unless `resume_on_other_data`; returns the dataset digests it was trained on before."""
        previous_path = self.model_directory.local / RESOLVED_CONFIG
        if not checkpoints.checkpoints_on_disk(self.model_directory.local) or not previous_path.exists():
            return []
        try:
            previous = json.loads(previous_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{self.config.model_dir}/{RESOLVED_CONFIG}: not valid JSON ({error})") from error
        wanted = {**config_to_dict(self.config), "num_classes": self.num_classes}
        held = {**previous, "num_classes": previous.get("resolved", {}).get("num_classes")}
        differing = [name for name in ARCHITECTURE_FIELDS if held.get(name) != wanted.get(name)]
        if differing:
            described = ", ".join(f"{name} {held.get(name)!r} there, {wanted.get(name)!r} asked" for name in differing)
            raise ValueError(
                f"model_dir: {self.config.model_dir} holds checkpoints of another model ({described}); nothing was "
                "changed. Give another --model-dir, or --warm-start from it"
            )
        history = list(previous.get("resolved", {}).get("dataset_history", []))
        trained_on = previous.get("resolved", {}).get("dataset_manifest_sha256")
        if trained_on and trained_on != self.dataset.manifest_sha256:
            if not self.config.resume_on_other_data:
                raise ValueError(
                    f"data: {self.config.data} (manifest {self.dataset.manifest_sha256[:12]}) is not the dataset the "
                    f"checkpoints in {self.config.model_dir} were trained on ({trained_on[:12]}); nothing was changed. "
                    "Give --resume-on-other-data to continue training on it (it is recorded in config.json)"
                )
            logger.warning(
                "resuming on another dataset than before (%s, was %s)",
                self.dataset.manifest_sha256[:12],
                trained_on[:12],
            )
            history.append(trained_on)
        return history

    def _write_resolved_config(self, dataset_history: list[str]) -> None:
        if not self.chief:
            return
        resolved = {
            **config_to_dict(self.config),
            "resolved": {
                "num_classes": self.num_classes,
                "label_names": self.dataset.manifest.label_names,
                "image_shape": self.dataset.manifest.image_shape,
                "train_examples": self.train_examples,
                "total_steps": self.total_steps,
                "scaled_learning_rate": self.config.scaled_learning_rate(),
                "dataset_manifest_sha256": self.dataset.manifest_sha256,
                "synthetic_data": self.dataset.manifest.synthetic,
                "replicas": self.strategy.num_replicas_in_sync,
                "dataset_history": dataset_history,  # earlier datasets these checkpoints were trained on
            },
        }
        content = json.dumps(resolved, indent=2, sort_keys=True).encode()
        storage.atomic_write_bytes(self.model_directory.local / RESOLVED_CONFIG, content)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        config = self.config
        self._write_resolved_config(self._check_model_directory_fits())
        start_step = self._start()
        summaries = _Summaries(
            self.model_directory.local / "train",
            self.chief,
            config,
            publish=self.model_directory.push if self.model_directory.remote else None,
        )
        summaries.config_text(json.dumps(config_to_dict(config), indent=2, sort_keys=True))
        distributed = self.strategy.distribute_datasets_from_function(
            lambda context: data.train_dataset(
                self.dataset,
                context,
                config.batch_size,
                config.seed + start_step,
                config.in_memory,
                config.shuffle_buffer,
                config.augment,
            )
        )
        iterator = iter(distributed)
        step_function = self._make_step_function()
        step, last_save_time, window_start, window_step = start_step, time.monotonic(), time.monotonic(), start_step
        host: dict = {}
        preempted = False
        self.termination.check("before the first step")
        termination = self.termination
        while step < self.total_steps:
            due_by_time = (
                config.checkpoint_every_seconds is not None
                and time.monotonic() - last_save_time >= config.checkpoint_every_seconds
            )
            summaries.maybe_profile(step)
            outputs, batch = step_function(iterator, tf.constant([int(termination.requested), int(due_by_time)]))
            host = {key: value.numpy() for key, value in outputs.items()}
            gradients_failed = not host["gradients_finite"] and config.precision != "mixed_float16"
            if not host["loss_finite"] or gradients_failed or not host["state_finite"]:
                what = (
                    "the loss"
                    if not host["loss_finite"]
                    else "a gradient"
                    if gradients_failed
                    else "the model's state after the update (weights, batch-norm statistics or their average)"
                )
                raise NumericsError(
                    f"step {step + 1}: {what} is NaN or Inf (loss {host['loss']}); training stopped and this "
                    "step's state was not checkpointed. Lower the learning rate or enable gradient clipping."
                )
            step += 1
            if step == start_step + 1:
                summaries.images(batch, self.strategy, config.image_summaries, step)
            stop_agreed, save_agreed = host["flags"][0] > 0, host["flags"][1] > 0
            if step % config.log_every_steps == 0 or step == self.total_steps:
                now = time.monotonic()
                rate = (step - window_step) * config.batch_size / max(now - window_start, 1e-9)
                remaining = (self.total_steps - step) * config.batch_size / max(rate, 1e-9)
                logger.info(
                    "step %d/%d loss %.4f accuracy %.3f lr %.5f %.0f examples/s ETA %s",
                    step,
                    self.total_steps,
                    host["loss"],
                    host["accuracy"],
                    host["learning_rate"],
                    rate,
                    format_duration(remaining),
                )
                host["examples_per_second"] = rate
                window_start, window_step = now, step
            if step % config.summary_every_steps == 0:
                summaries.scalars(host, step)
            if config.histogram_every_steps and step % config.histogram_every_steps == 0:
                summaries.histograms(self.model, step)
            by_steps = config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0
            if stop_agreed or by_steps or save_agreed:
                self._save(step)
                last_save_time = time.monotonic()
            if stop_agreed:
                preempted = True
                break
        if not preempted and (
            not self.manager.latest_checkpoint or not self.manager.latest_checkpoint.endswith(f"-{step}")
        ):
            self._save(step)
        summaries.close()
        metrics = {
            key: float(np.asarray(value))
            for key, value in host.items()
            if key in ("loss", "cross_entropy", "accuracy", "gradient_norm", "learning_rate", "examples_per_second")
        }
        result = TrainResult(
            model_dir=config.model_dir,
            step=step,
            total_steps=self.total_steps,
            checkpoint=self._published_checkpoint(),
            metrics=metrics,
            weights_sha256=_weights_sha256(self.model),
            preempted=preempted,
            chief=self.chief,
        )
        logger.info("weights sha256 %s (%s) at step %d", result.weights_sha256, self._worker_name(), step)
        if self.chief:
            storage.atomic_write_bytes(
                self.model_directory.local / TRAIN_METRICS,
                json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True).encode(),
            )
        if self.chief:
            self.model_directory.push(remove_deleted_checkpoints=True)
        return result

    def _worker_name(self) -> str:
        return self.cluster.name if self.cluster else "single worker"

    def _published_checkpoint(self) -> str | None:
        latest = self.manager.latest_checkpoint
        if latest is None or not self.chief:
            return None
        relative = Path(latest).relative_to(self.model_directory.local).as_posix()
        return f"{self.config.model_dir.rstrip('/')}/{relative}"

    def _save(self, step: int) -> None:
        path = self.manager.save(checkpoint_number=step)
        if self.chief:
            logger.info("saved checkpoint %s", path)
            self.model_directory.push(remove_deleted_checkpoints=True)


class _Summaries:
    """TensorBoard summaries under the model directory's `train/`; only the chief writes them.

    With a remote model directory (`publish` given), event files are written to a local staging folder and, at
    every summary interval, the current file is closed, moved into the mirror and published: summaries appear in
    the object store at least every summary interval, and each event file is uploaded once, whole (objects cannot
    be appended to). TensorBoard reads the folder's files in order, as one stream.
    """

    def __init__(self, directory: Path, enabled: bool, config: TrainConfig, publish=None):
        self.enabled = enabled
        self.config = config
        self.directory = directory
        self.publish = publish
        self.staging = storage.scratch_directory("summaries") if enabled and publish else directory
        self.writer = tf.summary.create_file_writer(str(self.staging)) if enabled else None
        self.profiling = False

    def _rotate(self) -> None:
        """Close the current event file, move what the staging folder holds into the mirror, publish it."""
        if self.staging == self.directory or self.profiling:
            return
        self.writer.close()
        for path in sorted(self.staging.rglob("*")):
            if path.is_file():
                target = self.directory / path.relative_to(self.staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(target))
        self.publish()
        self.writer = tf.summary.create_file_writer(str(self.staging))

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
            tf.profiler.experimental.start(str(self.staging))
            self.profiling = True
        elif step == last + 1 and self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False

    def close(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False
        if self.writer is not None:
            self._rotate()
            self.writer.close()
            if self.staging != self.directory:
                shutil.rmtree(self.staging, ignore_errors=True)


def train(config: TrainConfig) -> TrainResult:
    """Train one worker's part (or all of it, on one worker) to the planned step."""
    trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        trainer.close()  # also when training failed: the claim ends with the attempt
