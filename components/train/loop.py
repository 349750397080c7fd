"""The outer training loop: TF-Slim's `create_train_op`/`train` and the CIFAR-10 estimator example's loop, on TF2.

The step itself (forward, loss, the one all-reduce, gradient processing, the update, the numerics check) is
`step.TrainStep`; every replica computes identical updates, so every worker ends with identical weights. Around it,
this loop: start-up (resume from the newest readable checkpoint, warm start, refusals before anything is written),
checkpoints by steps and/or seconds (only the chief writes to the model directory), SIGTERM handling (a checkpoint
at a step all workers agree on, then exit code 143), exponential moving average, TensorBoard summaries
(`summaries.py`), progress lines with examples/s and ETA.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from components.common import filesystem
from components.common.compiled_kernels import settle_op_threads
from components.common.config import config_to_dict
from components.common.dataset import open_dataset
from components.common.model import ModelSpec, build_model, variable_name, weights_sha256, whitening_layer
from components.common.model_directory import (
    CHECKPOINT_PREFIX,
    RESOLVED_CONFIG,
    RESOLVED_CONFIG_SCHEMA,
    TRAIN_METRICS,
    VALIDATION_CURVE,
    VALIDATION_CURVE_SCHEMA,
    DamagedCheckpointError,
    ModelDirectory,
    list_checkpoints,
    read_document,
)
from components.common.out_of_space import out_of_space
from components.common.progress import format_duration
from components.train import checkpoints, data, distribution
from components.train.cadence import LOG_SECONDS, every, resolve
from components.train.config import TrainConfig, parse_assignments
from components.train.precision import resolve as resolve_precision
from components.train.step import TrainStep
from components.train.summaries import Summaries
from components.train.supervisor import report_phase
from components.train.termination import Termination
from components.train.validation import Validation

logger = logging.getLogger(__name__)
# The validation metrics' names in the log (Katib's objectiveMetricName; docs/sweep.md).
VALIDATION_LOSS, VALIDATION_ACCURACY = "validation-loss", "validation-accuracy"

# What makes a checkpoint another model: resuming with a different value cannot restore it.
ARCHITECTURE_FIELDS = ("model", "depth", "width_multiplier", "num_classes")
WHITENING_SAMPLE = 5000  # training images the patch whitening is fitted to (airbench's choice)


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
    stopped_early: bool = False  # by Katib's early stopping (components/train/termination.py): not to be retried
    chief: bool = True
    framework: str = "tensorflow"
    framework_version: str = tf.__version__


def _check_numerics(host: dict, step: int, precision: str) -> None:
    """Stop when the loss, a gradient (unless float16 loss scaling skips the step) or the state after the update
    is not finite; this step's state is then never checkpointed."""
    gradients_failed = not host["gradients_finite"] and precision != "mixed_float16"
    if host["loss_finite"] and not gradients_failed and host["state_finite"]:
        return
    what = (
        "the loss"
        if not host["loss_finite"]
        else "a gradient"
        if gradients_failed
        else "the model's state after the update (weights, batch-norm statistics or their average)"
    )
    raise NumericsError(
        f"step {step}: {what} is NaN or Inf (loss {host['loss']}); training stopped and this step's state was not "
        "checkpointed. Lower the learning rate or enable gradient clipping."
    )


def describe_learning_rate(config: TrainConfig) -> str:
    """What the progress lines' `lr` is: the rate on the gradient of the batch-mean loss, at this batch size. (Recipes
    written for a summed loss, as airbench's are, have rates smaller by the batch size: 106 here is airbench94_muon's
    0.053 x 2000.)"""
    said = (
        f"lr in the progress lines: the rate on the gradient of the batch-mean loss ({config.schedule} schedule of "
        f"a base rate {config.scaled_learning_rate():g} at batch {config.batch_size}; a summed-loss recipe would "
        f"write {config.scaled_learning_rate() / config.batch_size:.4g})"
    )
    if config.optimizer == "muon":
        said += f"; Muon's convolution kernels follow the same schedule from {config.muon_learning_rate:g}"
    return said


class Trainer:
    """Builds everything once; `run()` trains to the planned step."""

    def __init__(self, config: TrainConfig):
        config = dataclasses.replace(config, precision=resolve_precision(config.precision))  # auto: by the hardware
        settle_op_threads(config.precision)  # before TensorFlow runs an op
        self.config = config
        self.termination = Termination().install()  # from here on, a SIGTERM is never lost
        keras.utils.set_random_seed(config.seed)
        keras.mixed_precision.set_global_policy(config.precision)  # the precision names are Keras policies
        self.cluster = distribution.cluster_from_environment(config.workers)
        self.chief = self.cluster is None or self.cluster.is_chief
        self.model_directory = ModelDirectory(config.model_dir, config.cache_dir)
        self.write_dir: Path | None = None  # where this worker writes: the model directory, or scratch
        self.input_pipeline: tuple | None = None  # (distributed dataset, iterator): see run()
        self.validation_curve: list[dict] | None = None  # the validation measures written so far
        if self.chief:
            self.model_directory.claim_writer()  # before anything else: a second writer fails at once
        try:
            self._set_up(config)
        except BaseException:
            self.close()
            raise

    def _set_up(self, config: TrainConfig) -> None:
        check = self.termination.check
        joining = self.cluster is not None and self.cluster.size > 1
        if joining:
            # From here to the formed cluster the supervisor bounds the time and answers SIGTERM (supervisor.py).
            report_phase("joining", worker=self.cluster.name, peers=self.cluster.peers())
            distribution.wait_for_peers(self.cluster, config.peer_timeout_seconds, lambda: check("waiting for peers"))
        self.strategy = distribution.create_strategy(self.cluster)  # TensorFlow installs its SIGTERM handler here
        if joining:
            report_phase("joined")
        check("after forming the cluster")
        splits = tuple(config.train_on.split("+"))  # "train", or "train+validation"
        self.dataset = open_dataset(config.data, splits=splits, cache_dir=config.cache_dir).joined("train", splits)
        manifest = self.dataset.manifest
        self.num_classes = manifest.num_classes
        self.train_examples = sum(manifest.split(name).num_examples for name in splits)
        if not self.train_examples:
            raise ValueError(f"data: {config.data} has no training examples (its train split is empty)")
        self.steps_per_epoch = self.train_examples / config.batch_size
        self.total_steps = config.total_steps(self.train_examples)
        self.cadence = resolve(config, self.total_steps)
        check("after opening the dataset")
        self.model_directory.pull()
        self.write_dir = self.model_directory.local if self.chief else filesystem.scratch_directory(self.cluster.name)
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
        self.model_spec = spec = ModelSpec(
            family=config.model,
            depth=config.depth,
            width_multiplier=config.width_multiplier,
            num_classes=self.num_classes,
            data_format=config.data_format,
            batch_norm_decay=config.batch_norm_decay,
            batch_norm_epsilon=config.batch_norm_epsilon,
            image_shape=tuple(self.dataset.manifest.image_shape),
            test_time_augmentation=config.test_time_augmentation,
        )
        with self.strategy.scope():
            self.model = build_model(spec)
        self.train_step = TrainStep(
            config, self.strategy, self.model, self.num_classes, self.steps_per_epoch, self.total_steps
        )
        step = self.train_step
        self.state = checkpoints.TrainingState(
            self.model, step.optimizer, step.step, step.ema, step.lookahead, step.lookahead_started, step.muon
        )
        self.checkpoint = self.state.checkpoint()
        self.manager: tf.train.CheckpointManager | None = None  # once the model directory is known to fit (run)

    def _open_checkpoints(self) -> None:
        """The checkpoint manager, over a `checkpoint` state file made to list what is on disk: only after the
        model directory was found to fit this run, so that a refused run writes nothing."""
        if self.chief:
            checkpoints.remove_abandoned_saves(self.model_directory.local)
            checkpoints.reconcile_state_file(self.model_directory.local)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(self.write_dir),
            max_to_keep=self.config.max_to_keep,
            keep_checkpoint_every_n_hours=self.config.keep_checkpoint_every_hours,
            checkpoint_name=CHECKPOINT_PREFIX,
        )

    # -- start: resume or warm start -------------------------------------------------------------------------

    def _start(self) -> int:
        restored = checkpoints.restore_latest(self.checkpoint, self.model_directory.local)
        if restored is not None:
            step = int(self.train_step.step.numpy())
            logger.info("resuming from %s at step %d", restored, step)
            if self.config.warm_start:
                logger.info("not warm-starting: the model directory already has checkpoints")
            return step
        self._fit_whitening()  # before a warm start, which may bring its own
        if self.config.warm_start and self._warm_start():
            for variable in self.train_step.trained:
                if self.train_step.ema:
                    self.train_step.ema[variable_name(variable)].assign(variable.value)
        logger.info("starting from step 0")
        return 0

    def _warm_start(self) -> bool:
        """Assign the warm-start checkpoint's values; whether it was used. A checkpoint that cannot be read whole
        ends training in one line, unless `warm_start_if_damaged` is from_scratch (said, then from scratch)."""
        try:
            checkpoints.warm_start(
                self.model.variables,
                self.config.warm_start,
                tuple(self.config.warm_start_include),
                tuple(self.config.warm_start_exclude),
                parse_assignments(self.config.warm_start_map, "warm_start_map"),
                self.config.cache_dir,
            )
        except DamagedCheckpointError as error:
            if self.config.warm_start_if_damaged != "from_scratch":
                raise
            logger.warning("%s; training from scratch, as warm_start_if_damaged=from_scratch asks", error)
            return False
        return True

    def _fit_whitening(self) -> None:
        """A model that starts with patch whitening gets it fitted, once, by the chief, to the first training
        images; the other workers receive the chief's values, so all start identical."""
        layer = whitening_layer(self.model)
        if layer is None:
            return
        sample = min(WHITENING_SAMPLE, self.train_examples)
        if self.chief:
            images, _labels = next(iter(self.dataset.tf_dataset("train", batch_size=sample)))
            fitted = layer.fitted_values(images.numpy())
        else:
            fitted = [np.zeros(variable.shape, np.float32) for variable in layer.weights_to_fit]
        values = distribution.broadcast_from_chief(self.strategy, fitted)
        for variable, value in zip(layer.weights_to_fit, values, strict=True):
            variable.assign(value)
        logger.info("patch whitening fitted by the chief to the first %d training images", sample)

    def _check_model_directory_fits(self) -> list[str]:
        """Before anything is written: a model directory that holds checkpoints must hold this model, trained on
        this dataset unless `resume_on_other_data`; returns the dataset digests it was trained on before."""
        previous_path = self.model_directory.local / RESOLVED_CONFIG
        if not list_checkpoints(self.model_directory.local) or not previous_path.exists():
            return []
        previous = read_document(
            self.model_directory.local, RESOLVED_CONFIG, RESOLVED_CONFIG_SCHEMA, self.config.model_dir
        )
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
                    "Give --resume-on-other-data (in a pipeline: TRAIN_OPTIONS='{\"resume_on_other_data\": true}') "
                    "to continue training on it (it is recorded in config.json)"
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
            "model_spec": self.model_spec.to_dict(),  # what the model is, for every stage that builds it
            "resolved": {
                "num_classes": self.num_classes,
                "label_names": self.dataset.manifest.label_names,
                "image_shape": self.dataset.manifest.image_shape,
                "resize_images": bool(self.dataset.manifest.parameters.get("resize")),  # served images are resized too
                "train_examples": self.train_examples,
                "total_steps": self.total_steps,
                "scaled_learning_rate": self.config.scaled_learning_rate(),
                "dataset_manifest_sha256": self.dataset.manifest_sha256,
                "synthetic_data": self.dataset.manifest.synthetic,
                "replicas": self.strategy.num_replicas_in_sync,
                "dataset_history": dataset_history,  # earlier datasets these checkpoints were trained on
                "cadence": dataclasses.asdict(self.cadence),
            },
        }
        content = json.dumps(resolved, indent=2, sort_keys=True).encode()
        filesystem.atomic_write_bytes(self.model_directory.local / RESOLVED_CONFIG, content)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        config = self.config
        dataset_history = self._check_model_directory_fits()  # before anything is written
        if self.chief:
            self.model_directory.check_writer()
        self._open_checkpoints()
        self._write_resolved_config(dataset_history)
        start_step = self._start()
        logger.info("%s", describe_learning_rate(config))
        summaries = Summaries(
            self.model_directory.local,
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
                config.seed,
                config.in_memory,
                config.shuffle_buffer,
                config.augment,
                config.augmentation,
                config.translate,
                start_step=start_step,
                brightness=config.brightness,
                contrast=config.contrast,
            )
        )
        iterator = iter(distributed)
        # Kept past run(): tearing the distributed input pipeline down (its prefetching threads) takes about 12 s, and
        # a worker of a cluster ends by os._exit without it (launcher.leave_at_once), right after the others.
        self.input_pipeline = (distributed, iterator)
        step_function = self.train_step
        step, last_save_time, window_start, window_step = start_step, time.monotonic(), time.monotonic(), start_step
        cadence = self.cadence
        validation = self._validation()
        host: dict = {}
        preempted = stopped_early = False
        self.termination.check("before the first step")
        termination = self.termination
        while step < self.total_steps:
            due_by_time = (
                config.checkpoint_every_seconds is not None
                and time.monotonic() - last_save_time >= config.checkpoint_every_seconds
            )
            summaries.maybe_profile(step)
            outputs, batch = step_function(
                iterator, termination.requested, save_due=due_by_time, stopped_early=termination.stopped_early
            )
            host = {key: value.numpy() for key, value in outputs.items()}
            _check_numerics(host, step + 1, config.precision)
            step += 1
            if step == start_step + 1:
                summaries.images(batch, self.strategy, config.image_summaries, step)
            stop_agreed, save_agreed = bool(host["stop_agreed"]), bool(host["save_agreed"])
            now = time.monotonic()
            if every(step, cadence.log, last=self.total_steps) or now - window_start >= LOG_SECONDS:
                host["examples_per_second"] = (step - window_step) * config.batch_size / max(now - window_start, 1e-9)
                self._log_progress(step, host)
                window_start, window_step = now, step
            if every(step, cadence.summary):
                summaries.scalars(host, step)
            if every(step, cadence.histogram):
                summaries.histograms(self.model, step)
            if validation is not None and every(step, cadence.validation, last=self.total_steps):
                measured = validation.measure()
                summaries.validation(measured, step)
                # name=value, as Katib's metrics collectors read a metric from a log line (docs/sweep.md)
                logger.info("step %d %s=%.4f %s=%.4f (%d images)", step, VALIDATION_LOSS, measured["loss"],
                            VALIDATION_ACCURACY, measured["accuracy"], len(validation))  # fmt: skip
                self._record_validation(step, measured)
            if stop_agreed or save_agreed or every(step, cadence.checkpoint):
                self._save(step)
                last_save_time = time.monotonic()
            if stop_agreed:
                stopped_early, preempted = bool(host["stopped_early"]), not host["stopped_early"]
                break
        if not (preempted or stopped_early) and (
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
            weights_sha256=weights_sha256(self.model),
            preempted=preempted,
            stopped_early=stopped_early,
            chief=self.chief,
        )
        logger.info("weights sha256 %s (%s) at step %d", result.weights_sha256, self._worker_name(), step)
        if self.chief:
            filesystem.atomic_write_bytes(
                self.model_directory.local / TRAIN_METRICS,
                json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True).encode(),
            )
            self.model_directory.push(remove_deleted_checkpoints=True)
        distribution.wait_for_every_worker_to_finish(self.cluster)
        return result

    def _record_validation(self, step: int, measured: dict[str, float]) -> None:
        """The validation curve so far, in the model directory (pushed with the next checkpoint): a search reads it to
        prune a trial that falls behind. A resumed run keeps the measures before its start."""
        path = self.model_directory.local / VALIDATION_CURVE
        if self.validation_curve is None:
            earlier = []
            if path.exists():
                document = read_document(self.model_directory.local, VALIDATION_CURVE, VALIDATION_CURVE_SCHEMA)
                earlier = [point for point in document["curve"] if point["step"] < step]
            self.validation_curve = earlier
        self.validation_curve.append({"step": step, **measured})
        filesystem.atomic_write_bytes(path, json.dumps({"curve": self.validation_curve}).encode())

    def _validation(self) -> Validation | None:
        """The validation split's measure, on the chief, when the dataset has that split and it is asked for."""
        split = self.dataset.manifest.splits.get("validation")
        if not self.chief or not self.cadence.validation or split is None or not split.num_examples:
            return None
        if "validation" in self.config.train_on:  # trained on: measuring it would say nothing
            return None
        return Validation(open_dataset(self.config.data, splits=("validation",), cache_dir=self.config.cache_dir),
                          self.model)  # fmt: skip

    def _log_progress(self, step: int, host: dict) -> None:
        rate = host["examples_per_second"]
        remaining = (self.total_steps - step) * self.config.batch_size / max(rate, 1e-9)
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

    def _worker_name(self) -> str:
        return self.cluster.name if self.cluster else "single worker"

    def _published_checkpoint(self) -> str | None:
        latest = self.manager.latest_checkpoint
        if latest is None or not self.chief:
            return None
        relative = Path(latest).relative_to(self.model_directory.local).as_posix()
        return f"{self.config.model_dir.rstrip('/')}/{relative}"

    def _save(self, step: int) -> None:
        if self.chief:
            self.model_directory.check_writer()  # the folder at the path is still this run's: else stop, write nothing
        try:
            path = self.manager.save(checkpoint_number=step)
        except Exception as error:
            if out_of_space(error):  # what TensorFlow left of this step's checkpoint would only take space
                checkpoints.remove_partial_checkpoint(self.write_dir, step)
            raise
        if self.chief:
            logger.info("saved checkpoint %s", path)
            self.model_directory.push(remove_deleted_checkpoints=True)


def train(config: TrainConfig) -> TrainResult:
    """Train one worker's part (or all of it, on one worker) to the planned step."""
    trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        trainer.close()  # also when training failed: the claim ends with the attempt
