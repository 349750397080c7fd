"""The evaluate stage: checkpoints -> metrics, TensorBoard `eval/` summaries, a report, the gate, promotion.

Any error (missing checkpoint, another architecture or number of classes, NaN weights or metrics, an
empty or mismatched dataset) raises with a clear message: an evaluation that failed is never blessed.

It owns the Evaluator (its three modes) and the report's assembly; the metrics, the gate, the report's parts and
promotion are in metrics.py, gate.py, report.py and promote.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from components.common import data_statistics, filesystem, outputs, storage, stores
from components.common.config import config_to_dict
from components.common.dataset import open_dataset
from components.common.model import build_model, check_label_count, model_spec_of, predict_logits, weights_sha256
from components.common.model_directory import (
    EVAL_LOGS,
    EVAL_METRICS,
    RESOLVED_CONFIG,
    TRAIN_METRICS,
    TRAIN_METRICS_SCHEMA,
    CheckpointError,
    ModelDirectory,
    checkpoint_files,
    checkpoint_step,
    list_checkpoints,
    read_document,
)
from components.common.progress import Progress
from components.common.values import shown
from components.evaluate import gate, metrics, promote, registry, report
from components.evaluate.baseline import Baseline, EvaluatedData, promoted_baseline
from components.evaluate.canary import CANARY_IMAGES, Canary
from components.evaluate.config import EvaluateConfig
from components.evaluate.restore import EvaluationError, read_train_config, restore_weights

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"


@dataclass
class CheckpointResult:
    checkpoint: str
    step: int
    weights: str  # "ema" or "raw"
    metrics: metrics.Metrics
    probabilities: np.ndarray = field(repr=False, compare=False)  # [image, class], for the report's examples


@dataclass
class EvaluationResult:
    results: list[CheckpointResult]
    decision: gate.Decision
    label_names: list[str]
    report_html: str
    promotion: promote.Promotion | None = None
    baseline_accuracy: float | None = None
    pointer_version: str = stores.ABSENT  # of the current-model pointer the gate compared with
    record: dict | None = None  # what a promotion writes into the pointer
    without_leaks: dict | None = None  # {"accuracy", "leaking_images"}: on the images without a training near-duplicate
    registration: registry.Registered | None = None  # in the Model Registry (model_registry set and promoted)

    @property
    def final(self) -> CheckpointResult:
        return self.results[-1]

    def summary(self) -> dict:
        return {
            "checkpoint": self.final.checkpoint,
            "step": self.final.step,
            "weights": self.final.weights,
            "metrics": self.final.metrics.scalars(),
            "per_class": {
                name: {"precision": p, "recall": r, "f1": f}
                for name, p, r, f in zip(
                    self.label_names,
                    self.final.metrics.precision,
                    self.final.metrics.recall,
                    self.final.metrics.f1,
                    strict=True,
                )
            },
            "confusion_matrix": self.final.metrics.confusion_matrix,
            "label_names": self.label_names,
            "blessed": self.decision.blessed,
            "reasons": self.decision.reasons,
            "baseline_accuracy": self.baseline_accuracy,
            "history": [{"step": r.step, **r.metrics.scalars()} for r in self.results],
            "promotion": None if self.promotion is None else self.promotion.__dict__,
            "without_leaks": self.without_leaks,
            "registration": None if self.registration is None else self.registration.summary(),
        }


class Evaluator:
    def __init__(self, config: EvaluateConfig, lineage: registry.Lineage | None = None):
        self.config = config
        self.lineage = lineage or registry.Lineage()  # the KFP run and image a registration records
        filesystem.apply_single_writer_option(config.assume_single_writer)
        self.dataset = open_dataset(config.data, splits=(config.split,), cache_dir=config.cache_dir)
        manifest = self.dataset.manifest
        if manifest.splits[config.split].num_examples == 0:
            raise EvaluationError(f"{config.data}: split {config.split!r} is empty")
        if config.mode == "continuous":
            self._wait_for_training_to_start()
        self.directory = ModelDirectory(config.model_dir, config.cache_dir, create=False)
        self.directory.pull()
        self.train_config = read_train_config(self.directory.local, config.model_dir)
        trained_on = self.train_config.get("resolved", {})
        if trained_on.get("label_names") != manifest.label_names:
            raise EvaluationError(
                f"{config.data} has classes {manifest.label_names}, but {config.model_dir} was trained on "
                f"{trained_on.get('label_names')}: the dataset does not match the model"
            )
        self.label_names = manifest.label_names
        self.model_spec = model_spec_of(self.train_config)
        self.model = build_model(self.model_spec)
        trained_config = f"{config.model_dir} (its training config)"
        check_label_count(
            int(self.model.output_shape[-1]), self.label_names, trained_config, f"{config.data}'s manifest"
        )
        self.images, self.labels, self.ids = self._load_split()
        self.statistics = data_statistics.dataset_statistics(config.data, manifest)  # None: prepared before them
        leaking = set((self.statistics or {}).get("leaking_ids", {}).get(config.split, []))
        self.leaking = np.array([example_id in leaking for example_id in self.ids], bool)
        # The views the model was trained to be evaluated with (airbench's), unless the configuration says otherwise.
        self.test_time_augmentation = config.test_time_augmentation or self.model_spec.test_time_augmentation
        self.predict = tf.function(
            lambda images: tf.nn.softmax(predict_logits(self.model, images, self.test_time_augmentation), -1)
        )
        self.summary_writer = tf.summary.create_file_writer(str(self.directory.local / EVAL_LOGS))

    def _wait_for_training_to_start(self) -> None:
        """Continuous mode may start before training does: wait (at most `timeout_seconds`) for the model directory's
        resolved config, which training writes before its first step."""
        config = self.config
        deadline = time.monotonic() + config.timeout_seconds
        announced = False
        while True:
            try:
                directory = ModelDirectory(config.model_dir, config.cache_dir, create=False)
                if filesystem.is_remote(config.model_dir):
                    present = storage.publisher_for(directory.uri).checksum(RESOLVED_CONFIG) is not None
                else:
                    present = (directory.local / RESOLVED_CONFIG).exists()
            except CheckpointError:  # the folder itself is not there yet
                present = False
            if present:
                return
            if time.monotonic() >= deadline:
                raise EvaluationError(
                    f"{config.model_dir}: training did not start within {config.timeout_seconds:g} s (no "
                    f"{RESOLVED_CONFIG} appeared); start the train stage, or raise --timeout-seconds"
                )
            if not announced:
                logger.info("waiting up to %g s for training to start writing %s", config.timeout_seconds,
                            config.model_dir)  # fmt: skip
                announced = True
            time.sleep(min(config.poll_seconds, max(0.0, deadline - time.monotonic())))

    def _load_split(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        images, labels, ids = [], [], []
        for batch_images, batch_labels, batch_ids in self.dataset.tf_dataset(self.config.split, 4096, with_ids=True):
            images.append(batch_images.numpy())
            labels.append(batch_labels.numpy())
            ids.extend(example_id.decode() for example_id in batch_ids.numpy())
        return np.concatenate(images), np.concatenate(labels), ids

    def without_leaks(self, probabilities: np.ndarray) -> dict | None:
        """The accuracy on the images that have no near-duplicate in the training split (None when none leaks)."""
        if not self.leaking.any() or self.leaking.all():
            return None
        kept = ~self.leaking
        accuracy = float(np.mean(probabilities[kept].argmax(axis=1) == self.labels[kept]))
        return {"accuracy": accuracy, "leaking_images": int(self.leaking.sum())}

    def probabilities(self) -> np.ndarray:
        batches = []
        progress = Progress("evaluate", len(self.labels), unit="images", logger=logger, quiet_below_seconds=2.0)
        for start in range(0, len(self.labels), self.config.batch_size):
            batch = self.images[start : start + self.config.batch_size]
            batches.append(self.predict(tf.constant(batch)).numpy())
            progress.advance(len(batch))
        return np.concatenate(batches)

    def evaluate_checkpoint(self, checkpoint: str) -> CheckpointResult:
        weights = restore_weights(self.model, checkpoint, self.config.weights)
        probabilities = self.probabilities()
        try:
            result = metrics.compute(probabilities, self.labels)
        except ValueError as error:
            raise EvaluationError(f"{checkpoint}: {error}") from error
        if not np.isfinite(result.loss):
            raise EvaluationError(f"{checkpoint}: the loss is NaN or Inf")
        step = checkpoint_step(checkpoint)
        scalars = result.scalars()
        logger.info(
            "step %d (%s weights): accuracy %.4f, top-5 %.4f, loss %.4f, ECE %.4f",
            step,
            weights,
            scalars["accuracy"],
            scalars["top5_accuracy"],
            scalars["loss"],
            scalars["expected_calibration_error"],
        )
        with self.summary_writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
            heatmap = report.confusion_heatmap(np.asarray(result.confusion_matrix))
            tf.summary.image("confusion_matrix", heatmap[None], max_outputs=1)
        self.summary_writer.flush()
        per_checkpoint = self.directory.local / EVAL_LOGS / f"metrics-{step}.json"
        document = {"checkpoint": checkpoint, "weights": weights, **result.to_dict()}
        filesystem.atomic_write_bytes(per_checkpoint, json.dumps(document, indent=2).encode())
        return CheckpointResult(checkpoint, step, weights, result, probabilities)

    # -- which checkpoints ----------------------------------------------------------------------------------

    def checkpoints_to_evaluate(self) -> list[str]:
        config = self.config
        available = list_checkpoints(self.directory.local)
        if config.checkpoint:
            wanted = str(self.directory.local / Path(config.checkpoint).name)
            if wanted not in available:
                raise EvaluationError(
                    f"{config.model_dir}: has no checkpoint {config.checkpoint!r}; "
                    f"it has {[Path(path).name for path in available]}"
                )
            return [wanted]
        if not available:
            raise EvaluationError(f"{config.model_dir}: has no checkpoint to evaluate")
        return available if config.mode == "all" else available[-1:]

    def continuous(self) -> list[CheckpointResult]:
        """Evaluate each new checkpoint as it appears, until training has ended or none came for the timeout."""
        config = self.config
        results: list[CheckpointResult] = []
        done: set[str] = set()
        last_new = time.monotonic()
        while True:
            self.directory.pull()
            fresh = [path for path in list_checkpoints(self.directory.local) if path not in done]
            for path in fresh:
                results.append(self.evaluate_checkpoint(path))
                done.add(path)
                last_new = time.monotonic()
            finished = self._training_finished_at()
            if finished is not None and any(checkpoint_step(path) >= finished for path in done):
                logger.info("training ended at step %d and its checkpoint is evaluated", finished)
                break
            if time.monotonic() - last_new >= config.timeout_seconds:
                logger.info("no new checkpoint for %.0f s: stopping", config.timeout_seconds)
                break
            time.sleep(config.poll_seconds)
        if not results:
            raise EvaluationError(f"{config.model_dir}: no checkpoint appeared within {config.timeout_seconds:.0f} s")
        return results

    def _training_finished_at(self) -> int | None:
        if not (self.directory.local / TRAIN_METRICS).exists():
            return None
        summary = read_document(self.directory.local, TRAIN_METRICS, TRAIN_METRICS_SCHEMA, self.config.model_dir)
        return None if summary.get("preempted") else summary["step"]

    # -- the run --------------------------------------------------------------------------------------------

    def run(self) -> EvaluationResult:
        config = self.config
        if config.mode == "continuous" and not config.checkpoint:
            results = self.continuous()
        else:
            results = [self.evaluate_checkpoint(path) for path in self.checkpoints_to_evaluate()]
        final = results[-1]
        pointer, pointer_version = (None, stores.ABSENT)
        root = config.promote_to or config.compare_with
        if root:
            pointer, pointer_version = promote.read_pointer(root)
        decision, baseline = self.decide(final.metrics.accuracy, promote.ready_version(pointer))
        logger.info("%s", decision.summary())
        record = self.record(final, decision)
        promotion = registration = None
        if decision.blessed and config.promote_to:
            outcome = self.promote(
                final.checkpoint, final.probabilities, final.metrics.accuracy, record, pointer_version
            )
            promotion, registration = outcome.promotion, outcome.registration
            if outcome.decision is not None:
                decision = outcome.decision  # decided again against a version promoted meanwhile
        result = EvaluationResult(
            results=results,
            decision=decision,
            label_names=self.label_names,
            report_html=self._report(results, decision, baseline, promotion),
            promotion=promotion,
            baseline_accuracy=baseline.accuracy,
            pointer_version=pointer_version,
            record=record,
            without_leaks=self.without_leaks(final.probabilities),
            registration=registration,
        )
        self._write_outputs(result)
        return result

    # -- the gate, and what a promotion records -------------------------------------------------------------------

    def evaluated_data(self) -> EvaluatedData:
        manifest = self.dataset.manifest
        return EvaluatedData(
            self.images, self.labels, self.label_names, self.dataset.manifest_sha256, self.config.split,
            manifest.synthetic,
        )  # fmt: skip

    def decide(self, accuracy: float, promoted: dict | None) -> tuple[gate.Decision, Baseline]:
        """The gate: the threshold, and the baseline: an explicit one, else the promoted model on these images."""
        config = self.config
        if config.baseline:
            baseline = Baseline(gate.read_baseline_accuracy(config.baseline), f"from {config.baseline}")
        else:
            baseline = promoted_baseline(promoted, self.evaluated_data(), config.cache_dir)
        refused = self.not_a_successor(promoted)
        if refused is not None:
            return gate.Decision(False, [refused]), baseline
        decision = gate.decide(
            accuracy, config.accuracy_threshold, baseline.accuracy, config.baseline_tolerance, baseline.description
        )
        if config.data_blocking:  # the data check's finding: whatever the accuracy, not on this data
            blocked = config.data_blocking.removeprefix("data check: ")
            decision = gate.Decision(False, [*decision.reasons, f"promotion blocked by the data check (data_check "
                                                                 f"block): {blocked}"])  # fmt: skip
        return decision, baseline

    def not_a_successor(self, promoted: dict | None) -> str | None:
        """Why this model cannot follow the promoted version whatever its accuracy: it is that very model (the same
        weights), or a model of other classes (another task, which would silently replace it; but a model trained on
        synthetic data, the demo's, gives way to the first one trained on real data); None otherwise."""
        if promoted is None:
            return None
        version, root = promoted["version"], self.config.promote_to or self.config.compare_with
        if promoted.get("weights_sha256") == weights_sha256(self.model):
            return f"already promoted as version {version} (the same weights)"
        demo_replaced = bool(promoted.get("synthetic_data")) and not self.dataset.manifest.synthetic
        if promoted.get("label_names") != self.label_names and not demo_replaced:  # the demo's gives way to real data
            theirs = shown(promoted.get("label_names"), 120)
            return (
                f"the promoted version {version} under {root} is a model of other classes ({theirs}); this one does "
                "not replace it: give it a promotion root of its own (--promote-to; make local-run PROMOTION_ROOT=...)"
            )
        return None

    def record(self, final: CheckpointResult, decision: gate.Decision) -> dict:
        """What a promotion writes into the pointer: the model's metrics, where it came from, what it was evaluated
        on (so that the next gate can tell like from unlike), and its lineage (the gate's decision, the dataset, the
        train settings: what a registration records, now or later)."""
        manifest = self.dataset.manifest
        return {
            "gate_decision": decision.summary(),
            "dataset": {"uri": self.config.data, "source": manifest.source},
            "train_settings": {key: value for key, value in self.train_config.items() if key != "resolved"},
            "metrics": final.metrics.scalars(),
            "checkpoint": final.checkpoint.replace(str(self.directory.local), self.config.model_dir.rstrip("/")),
            "step": final.step,
            "weights": final.weights,
            "weights_sha256": weights_sha256(self.model),  # the evaluated weights, held by the model now
            "model_dir": self.config.model_dir,
            "label_names": self.label_names,
            "num_classes": len(self.label_names),
            "dataset_manifest_sha256": self.dataset.manifest_sha256,
            "synthetic_data": self.dataset.manifest.synthetic,
            "evaluation": {
                "dataset_manifest_sha256": self.dataset.manifest_sha256,
                "split": self.config.split,
                "images": len(self.labels),
            },
            "test_time_augmentation": self.test_time_augmentation,  # the exported model serves with the same views
        }

    def promote(
        self, checkpoint: str, probabilities: np.ndarray, accuracy: float, record: dict, pointer_version: str
    ) -> promote.PromotionOutcome:
        """Promote the evaluated weights (in `self.model`, from `checkpoint`, which gave `probabilities` on the split's
        first images); when another promotion moved the pointer meanwhile, decide again against the version it
        promoted, on these same images."""
        candidate = promote.Candidate(
            model=self.model,
            label_names=self.label_names,
            record=record,
            checkpoint_files=checkpoint_files(checkpoint),
            test_time_augmentation=self.test_time_augmentation,
            resize=bool(self.train_config.get("resolved", {}).get("resize_images")),
            canary=Canary.from_evaluation(self.images, probabilities, self.labels, self.label_names),
            data_statistics=None if self.statistics is None else json.dumps(self.statistics, sort_keys=True).encode(),
        )

        def decide_again(promoted: dict | None) -> gate.Decision:
            return self.decide(accuracy, promoted)[0]

        outcome = promote.promote(
            candidate, self.config.promote_to, pointer_version, decide_again, self.config.serving_version
        )
        if outcome.promotion is None or not self.config.model_registry:
            return outcome
        registration = registry.registration_of(
            self.config.registered_model_name, outcome.pointer, self.config.promote_to, self.lineage
        )
        return dataclasses.replace(
            outcome, registration=registry.register_promotion(self.config.model_registry, registration)
        )

    def promote_from_record(self, record: dict, pointer_version: str) -> promote.PromotionOutcome:
        """The pipeline's promote step: promote the checkpoint an earlier evaluation blessed (`record`), against the
        pointer it read."""
        checkpoint = str(self.directory.local / Path(record["checkpoint"]).name)
        restore_weights(self.model, checkpoint, record["weights"])
        probabilities = self.predict(tf.constant(self.images[:CANARY_IMAGES])).numpy()
        return self.promote(checkpoint, probabilities, record["metrics"]["accuracy"], record, pointer_version)

    def _report(
        self,
        results: list[CheckpointResult],
        decision: gate.Decision,
        baseline: Baseline,
        promotion: promote.Promotion | None,
    ) -> str:
        final = results[-1]
        probabilities = final.probabilities
        predicted = probabilities.argmax(axis=1)
        wrong = np.flatnonzero(predicted != self.labels)[: self.config.misclassified_examples]
        grid = report.misclassified_grid(
            self.images[wrong], self.labels[wrong], predicted[wrong], probabilities[wrong].max(axis=1), self.label_names
        )
        manifest = self.dataset.manifest
        facts = {
            "model directory": self.config.model_dir,
            "checkpoint": Path(final.checkpoint).name,
            "step": str(final.step),
            "weights": final.weights,
            "test-time augmentation": self.test_time_augmentation,
            "dataset": f"{self.config.data} ({manifest.dataset}, split {self.config.split}, {len(self.labels)} images)",
            "model": "{model}{depth} x{width_multiplier}".format(**self.train_config),
        }
        if baseline.accuracy is not None:
            facts["baseline"] = f"{baseline.accuracy:.4f}: {baseline.description}"
        else:
            facts["baseline"] = f"none: {baseline.description}"
        if promotion:
            facts["promoted as"] = f"{promotion.version} ({promotion.saved_model})"
        warning = "Synthetic data: these numbers say nothing about CIFAR-10." if manifest.synthetic else None
        leaks = self.without_leaks(probabilities)
        if leaks is not None:
            facts["without leaking images"] = (
                f"accuracy {leaks['accuracy']:.4f} on the {len(self.labels) - leaks['leaking_images']} images without "
                f"a near-duplicate in training ({final.metrics.accuracy:.4f} with the {leaks['leaking_images']})"
            )
        return report.render(
            report.ReportContent(
                title=f"Evaluation of {Path(self.config.model_dir).name or self.config.model_dir} at step {final.step}",
                facts=facts,
                decision=decision,
                metrics=final.metrics,
                label_names=self.label_names,
                misclassified_html=grid,
                history=[(result.step, result.metrics.accuracy) for result in results],
                warning=warning,
                data_html=self._data_section(final.metrics.accuracy, leaks),
            )
        )

    def _data_section(self, accuracy: float, leaks: dict | None) -> str:
        """The report's data section: statistics against the promoted model's data, and the leaking pairs."""
        if self.statistics is None:
            return ""
        from components.evaluate.data_check import reference_statistics

        root = self.config.compare_with or self.config.promote_to or ""
        reference, described = reference_statistics("", root, self.dataset.manifest.synthetic)
        pairs = self._leaking_pairs()
        accuracies = None if leaks is None else (accuracy, leaks["accuracy"], leaks["leaking_images"])
        return report.data_section(self.statistics, reference, described, self.config.split, pairs, accuracies)

    def _leaking_pairs(self, wanted: int = 8) -> list[report.LeakingPair]:
        """The most similar leaking pairs: this split's image beside its near-duplicate, read from the train shards."""
        listed = next(
            (
                c["pairs"]
                for c in self.statistics["duplicates"]
                if c["split"] == self.config.split and c["other"] == "train"
            ),
            [],
        )[:wanted]
        if not listed:
            return []
        position = {example_id: index for index, example_id in enumerate(self.ids)}
        found = self._training_images({pair["other_id"] for pair in listed})
        return [
            report.LeakingPair(
                self.images[position[pair["id"]]],
                found.get(pair["other_id"]),
                pair["id"],
                pair["other_id"],
                pair["similarity"],
            )
            for pair in listed
            if pair["id"] in position
        ]

    def _training_images(self, wanted: set[str]) -> dict[str, np.ndarray]:
        try:
            train = open_dataset(self.config.data, splits=("train",), cache_dir=self.config.cache_dir)
        except ValueError as error:  # the report goes on without the pictures
            logger.warning("the leaking pairs' training images are not shown: %s", error)
            return {}
        found = {}
        for images, _labels, ids in train.tf_dataset("train", 4096, with_ids=True):
            for image, example_id in zip(images.numpy(), ids.numpy(), strict=True):
                if example_id.decode() in wanted:
                    found[example_id.decode()] = image
        return found

    def _write_outputs(self, result: EvaluationResult) -> None:
        summary = {**result.summary(), "config": config_to_dict(self.config)}
        filesystem.atomic_write_bytes(
            self.directory.local / EVAL_METRICS, json.dumps(summary, indent=2, sort_keys=True).encode()
        )
        self.summary_writer.close()
        if self.config.output_dir:
            publisher = storage.publisher_for(self.config.output_dir)
            publisher.publish(REPORT_FILE, result.report_html.encode())
            publisher.publish(EVAL_METRICS, json.dumps(summary, indent=2, sort_keys=True).encode())
        else:
            outputs.write_text(self.directory.local / EVAL_LOGS / REPORT_FILE, result.report_html, "evaluation report")
        self.directory.push()


def evaluate(config: EvaluateConfig) -> EvaluationResult:
    return Evaluator(config).run()
