"""The evaluate stage on real checkpoints: metrics, summaries, report, gate, export, continuous mode, bad inputs."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from components.common.model import build_model, model_spec_of
from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import evaluate
from components.evaluate.pointer import read_ready
from components.evaluate.restore import EvaluationError, read_train_config, restore_weights
from components.train import loop
from tests.builders import scalar_series, tiny_train_config

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(synthetic_data, tmp_path_factory):
    """A tiny model trained 10 steps with checkpoints at 5 and 10 and a moving average of the weights."""
    model_dir = tmp_path_factory.mktemp("trained") / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=10, checkpoint_every_steps=5, ema_decay=0.9))
    return model_dir


def test_latest_checkpoint_metrics_summaries_and_report(synthetic_data, trained):
    result = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained)))

    assert [r.step for r in result.results] == [10]
    assert result.final.weights == "ema"  # the checkpoint has a moving average: it is what gets evaluated
    summary = json.loads((trained / "eval_metrics.json").read_text())
    assert summary["step"] == 10 and summary["metrics"]["accuracy"] == result.final.metrics.accuracy
    assert sum(map(sum, summary["confusion_matrix"])) == 50  # the eval split: 5 images x 10 classes
    assert set(summary["per_class"]) == set(result.label_names)
    assert dict(scalar_series(trained / "eval", "accuracy")) == {10: pytest.approx(result.final.metrics.accuracy)}
    html = (trained / "eval" / "report.html").read_text()
    for part in ("Confusion matrix", "Per class", "Misclassified images", "data:image/png;base64,", "Synthetic data"):
        assert part in html
    assert result.decision.blessed  # threshold 0, no baseline


def test_all_checkpoints_give_accuracy_by_step(synthetic_data, trained):
    result = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), mode="all", weights="raw"))
    assert [r.step for r in result.results] == [5, 10]
    assert set(dict(scalar_series(trained / "eval", "accuracy"))) >= {5, 10}
    assert "<svg" in result.report_html and "Accuracy by step" in result.report_html


def build_from_config(train_config: dict):
    return build_model(model_spec_of(train_config))


def test_the_model_directory_describes_its_model(trained):
    """config.json holds the model's spec as its own block; a directory written before the block existed reads the
    same from the train config."""
    train_config = read_train_config(trained, str(trained))
    spec = model_spec_of(train_config)
    assert train_config["model_spec"] == spec.to_dict()
    assert (spec.family, spec.depth, spec.num_classes, spec.image_shape) == ("resnet", 8, 10, (32, 32, 3))
    older = {key: value for key, value in train_config.items() if key != "model_spec"}
    assert model_spec_of(older) == spec
    with pytest.raises(ValueError, match=r"model_spec: unknown field\(s\) \['colour'\]"):
        model_spec_of({**train_config, "model_spec": {**train_config["model_spec"], "colour": "red"}})


def test_train_and_evaluate_find_the_same_checkpoints(synthetic_data, trained, tmp_path, caplog):
    """What counts as a checkpoint is one rule for both stages: a save's leftovers, a data file without its index
    and files that only look like checkpoints are neither evaluated nor resumed from."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    (model_dir / "ckpt-30_temp").mkdir()  # what a killed save leaves
    shutil.copy(model_dir / "ckpt-10.index", model_dir / "ckpt-30_temp" / "ckpt-30.index")
    (model_dir / "ckpt-40.data-00000-of-00001").write_bytes(b"no index: not a checkpoint")
    (model_dir / "ckpt-best.index").write_bytes(b"a stranger's file")
    shutil.copy(model_dir / "ckpt-10.index", model_dir / "ckpt-050.index")  # not a name TensorFlow writes

    evaluated = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(model_dir), mode="all", weights="raw"))
    assert [result.step for result in evaluated.results] == [5, 10]

    caplog.set_level(logging.INFO, logger="components.train")
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=12, checkpoint_every_steps=5, ema_decay=0.9))
    assert re.search(r"resum\w+ .*ckpt-10\b", caplog.text), caplog.text[-2000:]
    evaluated = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(model_dir), mode="all", weights="raw"))
    assert [result.step for result in evaluated.results] == [5, 10, 12]


def test_threshold_and_baseline_decide(synthetic_data, trained, tmp_path):
    accuracy = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained))).final.metrics.accuracy
    assert accuracy < 0.95  # ten steps with batch-norm decay 0.997: far from perfect, as the cases below need

    def decision(**options):
        return evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), **options)).decision

    assert decision(accuracy_threshold=accuracy).blessed  # at the threshold counts
    assert not decision(accuracy_threshold=accuracy + 0.02).blessed
    (tmp_path / "better.json").write_text(json.dumps({"accuracy": accuracy + 0.05}))
    worse_than_promoted = decision(baseline=str(tmp_path / "better.json"))
    assert not worse_than_promoted.blessed
    assert "is below the baseline" in " ".join(worse_than_promoted.reasons)
    assert decision(baseline=str(tmp_path / "better.json"), baseline_tolerance=0.06).blessed


def test_promotion_exports_a_saved_model_that_predicts_like_the_checkpoint(synthetic_data, trained, tmp_path):
    root = tmp_path / "promoted"
    result = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root)))

    written = json.loads((root / "current.json").read_text())
    assert (written["saved_model"], written["warm_start"]) == ("1", "1/checkpoint/ckpt-10")  # relative: it travels
    pointer = read_ready(str(root))
    assert pointer["version"] == result.promotion.version == 1 and pointer["step"] == 10
    assert pointer["state"] == "ready" and pointer["saved_model"] == str(root / "1")
    assert sorted(path.name for path in root.iterdir() if not path.name.startswith(".")) == [
        "1",
        "current.json",
    ]  # the TF Serving/KServe layout
    assert pointer["metrics"]["accuracy"] == result.final.metrics.accuracy
    served = tf.saved_model.load(pointer["saved_model"]).signatures["serving_default"]
    images = np.random.default_rng(0).integers(0, 256, size=(16, 32, 32, 3), dtype=np.uint8)
    outputs = served(images=tf.constant(images))

    model = build_from_config(read_train_config(trained, str(trained)))
    restore_weights(model, str(trained / "ckpt-10"), "auto")
    expected = tf.nn.softmax(model(images, training=False)).numpy()
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected, rtol=1e-5, atol=1e-6)
    names = [name.decode() for name in outputs["class_names"].numpy()]
    assert names == [result.label_names[index] for index in expected.argmax(axis=1)]

    # A second, worse-than-promoted evaluation compares with the pointer and is not promoted.
    again = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root), weights="raw"))
    assert again.baseline_accuracy == pointer["metrics"]["accuracy"]
    if again.final.metrics.accuracy < pointer["metrics"]["accuracy"]:
        assert not again.decision.blessed and again.promotion is None

    # The same model again (the demo rerun): equal is not better; it is not promoted as a new version.
    promoted = json.loads((root / "current.json").read_text())  # version 2 when the raw weights were not worse
    current, weights = promoted["version"], promoted["weights"]
    same = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root), weights=weights))
    assert not same.decision.blessed and same.promotion is None
    assert same.decision.reasons == [f"already promoted as version {current} (the same weights)"]
    assert json.loads((root / "current.json").read_text())["version"] == current


def test_a_model_of_other_classes_never_replaces_the_promoted_one(synthetic_data, trained, tmp_path):
    root = tmp_path / "promoted"
    evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root)))
    pointer = json.loads((root / "current.json").read_text())
    other_classes = {**pointer, "label_names": ["circle", "square"], "num_classes": 2}
    (root / "current.json").write_text(json.dumps(other_classes))
    other = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root), weights="raw"))
    assert not other.decision.blessed and other.promotion is None
    (reason,) = other.decision.reasons
    assert "is a model of other classes (['circle', 'square'])" in reason and "promotion root of its own" in reason


def test_continuous_mode_picks_up_a_checkpoint_written_after_it_started(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=4))
    (model_dir / "train_metrics.json").unlink()  # as if training were still going on
    config = EvaluateConfig(
        data=synthetic_data, model_dir=str(model_dir), mode="continuous", poll_seconds=0.5, timeout_seconds=120
    )
    from components.common.config import config_to_dict

    evaluator = subprocess.Popen(
        [sys.executable, "-m", "components.evaluate", "--config", json.dumps(config_to_dict(config))],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    deadline = time.monotonic() + 120
    while not (model_dir / "eval" / "metrics-4.json").exists():
        assert time.monotonic() < deadline and evaluator.poll() is None, evaluator.stdout.read()
        time.sleep(0.2)
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=8))  # resumes, writes ckpt-8, ends
    output, _ = evaluator.communicate(timeout=120)
    assert evaluator.returncode == 0, output[-3000:]
    assert "step 4 (" in output and "step 8 (" in output
    assert "training ended at step 8" in output


def test_continuous_mode_started_before_training_waits_for_it(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"  # does not exist yet
    config = EvaluateConfig(
        data=synthetic_data, model_dir=str(model_dir), mode="continuous", poll_seconds=0.5, timeout_seconds=120
    )
    from components.common.config import config_to_dict

    evaluator = subprocess.Popen(
        [sys.executable, "-m", "components.evaluate", "--config", json.dumps(config_to_dict(config))],
        cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    lines = []
    for line in evaluator.stdout:
        lines.append(line)
        if "waiting up to 120 s for training to start" in line:
            break
    assert evaluator.poll() is None, "".join(lines)
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=4))
    output, _ = evaluator.communicate(timeout=120)
    assert evaluator.returncode == 0, "".join(lines) + output[-3000:]
    assert "step 4 (" in output and "training ended at step 4" in output


def test_continuous_mode_waits_for_training_only_as_long_as_its_timeout(synthetic_data, tmp_path):
    config = EvaluateConfig(
        data=synthetic_data, model_dir=str(tmp_path / "never"), mode="continuous", poll_seconds=0.2, timeout_seconds=1
    )
    started = time.monotonic()
    with pytest.raises(EvaluationError, match=r"never: training did not start within 1 s \(no config\.json appeared\)"):
        evaluate(config)
    assert time.monotonic() - started < 30


class TestNeverBlessedOnError:
    def test_missing_checkpoint(self, synthetic_data, trained):
        with pytest.raises(EvaluationError, match=r"has no checkpoint 'ckpt-999'; it has \['ckpt-5', 'ckpt-10'\]"):
            evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), checkpoint="ckpt-999"))

    def test_no_checkpoint_at_all(self, synthetic_data, trained, tmp_path):
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "config.json").write_text((trained / "config.json").read_text())
        with pytest.raises(EvaluationError, match="has no checkpoint to evaluate"):
            evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(empty)))

    def test_not_a_model_directory(self, synthetic_data, tmp_path):
        with pytest.raises(EvaluationError, match=r"no config\.json; it is not a model directory"):
            evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(tmp_path)))

    @staticmethod
    def copy_of(trained: Path, target: Path, **config_changes) -> dict:
        """The trained model directory's last checkpoint, with its config.json changed; returns the config."""
        target.mkdir()
        for path in trained.glob("ckpt-10*"):
            (target / path.name).write_bytes(path.read_bytes())
        config = {**json.loads((trained / "config.json").read_text()), **config_changes}
        spec_changes = {key: value for key, value in config_changes.items() if key in config["model_spec"]}
        config["model_spec"] = {**config["model_spec"], **spec_changes}  # the model is what its spec says
        (target / "config.json").write_text(json.dumps(config))
        return config

    def test_checkpoint_of_another_architecture(self, synthetic_data, trained, tmp_path):
        other = tmp_path / "other"
        self.copy_of(trained, other, depth=14)
        with pytest.raises(EvaluationError, match=r"has no variable 'stage1_block2_\w+/\w+'; .*another architecture"):
            evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(other)))

    def test_checkpoint_with_another_number_of_classes(self, synthetic_data, trained, tmp_path):
        other = tmp_path / "other"
        config = self.copy_of(trained, other)
        model = build_from_config(config)
        head = model.get_layer("head").kernel
        with pytest.raises(EvaluationError, match=r"head/kernel has shape \[\d+, 10\], the model expects \[\d+, 12\]"):
            config["model_spec"]["num_classes"] = 12
            restore_weights(build_from_config(config), str(other / "ckpt-10"))
        assert head.shape[-1] == 10

    def test_nan_weights(self, synthetic_data, trained, tmp_path):
        from components.common.model import variable_name

        model = build_from_config(read_train_config(trained, str(trained)))
        restore_weights(model, str(trained / "ckpt-10"), "raw")
        model.get_layer("head").kernel.assign(np.full(model.get_layer("head").kernel.shape, np.nan, np.float32))
        poisoned = tmp_path / "poisoned"
        poisoned.mkdir()
        (poisoned / "config.json").write_text((trained / "config.json").read_text())
        tf.train.Checkpoint(weights={variable_name(v): v for v in model.variables}).write(str(poisoned / "ckpt-11"))
        with pytest.raises(EvaluationError, match=r"ckpt-11: variable head/kernel holds NaN or Inf"):
            evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(poisoned), weights="raw"))

    def test_dataset_of_other_classes(self, trained, tmp_path):
        from components.prepare_data.config import PrepareDataConfig
        from components.prepare_data.prepare import prepare_data

        prepare_data(PrepareDataConfig(output=str(tmp_path / "five"), source="synthetic", synthetic_classes=5))
        with pytest.raises(EvaluationError, match="the dataset does not match the model"):
            evaluate(EvaluateConfig(data=str(tmp_path / "five"), model_dir=str(trained)))

    def test_missing_split(self, trained, tmp_path):
        from components.common.dataset import DatasetError
        from components.prepare_data.config import PrepareDataConfig
        from components.prepare_data.prepare import prepare_data

        prepare_data(PrepareDataConfig(output=str(tmp_path / "d"), source="synthetic", validation_fraction=0.0))
        with pytest.raises(DatasetError, match=r"split 'validation' is not in the dataset"):
            evaluate(EvaluateConfig(data=str(tmp_path / "d"), model_dir=str(trained), split="validation"))

    def test_cli_exits_2_and_promotes_nothing(self, synthetic_data, trained, tmp_path):
        from components.evaluate.__main__ import main

        code = main(
            [
                "--data",
                synthetic_data,
                "--model-dir",
                str(trained),
                "--checkpoint",
                "ckpt-3",
                "--promote-to",
                str(tmp_path / "p"),
            ]
        )
        assert code == 2
        assert not (tmp_path / "p" / "current.json").exists()


def test_a_missing_model_directory_is_one_clear_line_and_is_not_created(synthetic_data, tmp_path, capfd):
    from components.evaluate.__main__ import main

    missing = tmp_path / "no-such-model"
    assert main(["--data", synthetic_data, "--model-dir", str(missing)]) == 2
    assert f"model_dir: {missing} is not a directory" in capfd.readouterr().err
    assert not missing.exists()


def test_a_torn_training_summary_is_named_in_one_clear_line(synthetic_data, trained, tmp_path, capfd):
    import shutil

    from components.evaluate.__main__ import main

    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    summary = (model_dir / "train_metrics.json").read_text()
    (model_dir / "train_metrics.json").write_text(summary[: len(summary) // 2])  # a writer killed mid-write
    code = main(
        ["--data", synthetic_data, "--model-dir", str(model_dir), "--mode", "continuous", "--timeout-seconds", "5"]
    )
    assert code == 2
    refused = r"train_metrics\.json: not a valid model directory's train_metrics\.json: not valid JSON"
    assert re.search(refused, capfd.readouterr().err)


def test_an_airbench_model_is_evaluated_with_the_whitening_it_was_trained_with(synthetic_data, tmp_path):
    """The fitted whitening (mean, deviation, filters: not trainable) travels in the checkpoint; evaluation
    rebuilds the model and predicts exactly as the trained model did."""
    from components.common.model import whitening_layer

    config = tiny_train_config(
        synthetic_data, tmp_path / "model", model="airbench", width_multiplier=0.125, batch_norm_decay=0.6
    )
    result = loop.train(config)
    train_config = read_train_config(tmp_path / "model", "test")
    model = build_from_config(train_config)
    restore_weights(model, result.checkpoint, "raw")
    fitted = whitening_layer(model)
    assert np.abs(fitted.kernel.numpy()).max() > 0 and not np.allclose(fitted.std.numpy(), 1.0)

    evaluation = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(tmp_path / "model")))
    images = np.concatenate([batch.numpy() for batch, _ in open_eval(synthetic_data)])
    expected = tf.nn.softmax(model(images)).numpy().argmax(axis=1)
    assert np.array_equal(evaluation.final.probabilities.argmax(axis=1), expected)


def open_eval(data: str):
    from components.common.dataset import open_dataset

    return open_dataset(data, splits=("eval",)).tf_dataset("eval", batch_size=500)


def test_test_time_augmentation_is_the_same_in_evaluation_and_in_the_exported_model(synthetic_data, tmp_path):
    """A model trained with test_time_augmentation=mirror_translate is evaluated with its six views, and the
    SavedModel it is promoted as answers with the same probabilities; without the views the answers differ."""
    from components.common.model import predict_logits

    config = tiny_train_config(
        synthetic_data, tmp_path / "model", model="airbench", width_multiplier=0.125, batch_norm_decay=0.6,
        test_time_augmentation="mirror_translate",
    )  # fmt: skip
    result = loop.train(config)
    evaluation = evaluate(
        EvaluateConfig(data=synthetic_data, model_dir=str(tmp_path / "model"), promote_to=str(tmp_path / "served"))
    )
    images = np.concatenate([batch.numpy() for batch, _ in open_eval(synthetic_data)])
    served = tf.saved_model.load(evaluation.promotion.saved_model).signatures["serving_default"]
    np.testing.assert_allclose(
        served(images=tf.constant(images))["probabilities"].numpy(), evaluation.final.probabilities, atol=1e-5
    )
    assert "test-time augmentation</th><td>mirror_translate" in evaluation.report_html

    model = build_from_config(read_train_config(tmp_path / "model", "test"))
    restore_weights(model, result.checkpoint, "raw")
    plain = tf.nn.softmax(predict_logits(model, tf.constant(images), "none")).numpy()
    assert not np.allclose(plain, evaluation.final.probabilities, atol=1e-3)
    flipped = tf.nn.softmax(model(images[:, :, ::-1, :])).numpy()
    mirror = tf.nn.softmax(predict_logits(model, tf.constant(images), "mirror")).numpy()
    np.testing.assert_allclose(
        mirror, tf.nn.softmax(0.5 * np.log(plain) + 0.5 * np.log(flipped)).numpy(), atol=1e-4
    )  # the mirror view averages logits (log-probabilities up to a constant per image)


@pytest.mark.parametrize("num_classes", [9, 12])
def test_a_model_scoring_another_number_of_classes_than_its_names_is_refused_in_one_line(
    synthetic_data, trained, tmp_path, num_classes
):
    """The model directory's config says the model scores `num_classes`, the data names 10: refused before anything
    is restored, naming both; and an export of names that do not fit the model is refused the same way."""
    from components.common.model import LabelCountError
    from components.evaluate.export import export_saved_model

    model_dir = tmp_path / "model"
    shutil.copytree(trained, model_dir)
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["model_spec"]["num_classes"] = num_classes
    config_file.write_text(json.dumps(config))
    with pytest.raises(LabelCountError) as refused:
        evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(model_dir)))
    assert f"lists 10 class names, but the model {model_dir} (its training config) scores {num_classes}" in str(
        refused.value
    )
    model = build_model(model_spec_of(config))
    with pytest.raises(LabelCountError, match=f"lists 10 class names, but the model .* scores {num_classes}"):
        export_saved_model(model, [f"class {index}" for index in range(10)], tmp_path / "export")
    assert not (tmp_path / "export").exists()
