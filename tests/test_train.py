"""The training loop, in-process on one worker: it learns, summarizes, checkpoints, resumes, and refuses bad states."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from components.common import filesystem
from components.common.config import config_to_dict
from components.common.model_directory import checkpoint_key
from components.train import checkpoints, loop
from components.train.checkpoints import CheckpointError
from tests.builders import scalar_series, tiny_train_config


def summary_tags(log_dir) -> set[str]:
    """Every summary tag written under `log_dir` (scalars, histograms, images and text alike)."""
    tags = set()
    for events in Path(log_dir).glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def checkpoint_value(path, name, collection="weights"):
    return tf.train.load_checkpoint(str(path)).get_tensor(checkpoint_key(collection, name))


def test_loss_goes_down_and_tensorboard_has_the_curves(synthetic_data, tmp_path):
    config = tiny_train_config(
        synthetic_data, tmp_path / "model", train_steps=40, histogram_every_steps=20, image_summaries=2
    )

    result = loop.train(config)

    losses = [value for _step, value in scalar_series(tmp_path / "model" / "train", "loss")]
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses
    for tag in ("accuracy", "learning_rate", "gradient_norm", "cross_entropy"):
        assert len(scalar_series(tmp_path / "model" / "train", tag)) == 40
    tags = summary_tags(tmp_path / "model" / "train")
    assert {"stem_conv/kernel", "head/kernel", "stage1_block1_bn1/moving_mean"} <= tags  # weight histograms
    assert {"augmented_inputs", "config"} <= tags  # input images and the resolved config as text
    assert result.step == 40 and result.checkpoint.endswith("ckpt-40")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["depth"] == 8 and saved["resolved"]["num_classes"] == 10 and saved["resolved"]["synthetic_data"]
    metrics = json.loads((tmp_path / "model" / "train_metrics.json").read_text())
    assert metrics["step"] == 40 and metrics["metrics"]["loss"] == pytest.approx(losses[-1], rel=1e-5)


def test_resume_continues_at_the_saved_step(synthetic_data, tmp_path, caplog):
    first = loop.train(tiny_train_config(synthetic_data, tmp_path / "model", train_steps=6, checkpoint_every_steps=3))
    assert first.step == 6

    with caplog.at_level("INFO"):
        second = loop.train(
            tiny_train_config(synthetic_data, tmp_path / "model", train_steps=9, checkpoint_every_steps=3)
        )

    assert "resuming from" in caplog.text and "at step 6" in caplog.text
    assert second.step == 9
    steps = [step for step, _ in scalar_series(tmp_path / "model" / "train", "loss")]
    assert steps == list(range(1, 10)), "no step trained twice, none skipped"


def test_airbench94_resumed_after_a_crash_ends_where_the_uninterrupted_run_ends(synthetic_data, tmp_path, caplog):
    """airbench's state survives a restart: the whitening is restored, not refitted; lookahead's slow weights and
    its started flag come back; the input stream continues mid-epoch; so the weights at the end are the same, bit
    for bit."""
    import shutil

    def airbench94(model_dir):
        return tiny_train_config(synthetic_data, model_dir, preset="airbench94", width_multiplier=0.125, batch_size=48,
                                 learning_rate_batch_size=48, lookahead_start_epochs=0.0, lookahead_every_steps=3,
                                 train_steps=8, checkpoint_every_steps=5)  # fmt: skip

    loop.train(airbench94(tmp_path / "uninterrupted"))
    shutil.copytree(tmp_path / "uninterrupted", tmp_path / "crashed")
    for path in (tmp_path / "crashed").glob("ckpt-8.*"):
        path.unlink()  # the run died after step 5's checkpoint
    with caplog.at_level("INFO"):
        result = loop.train(airbench94(tmp_path / "crashed"))

    assert "at step 5" in caplog.text and "patch whitening fitted" not in caplog.text
    assert result.step == 8
    reader = tf.train.load_checkpoint(str(tmp_path / "uninterrupted" / "ckpt-8"))
    resumed = tf.train.load_checkpoint(str(tmp_path / "crashed" / "ckpt-8"))
    names = [name for name in reader.get_variable_to_shape_map() if name.startswith(("weights/", "lookahead/"))]
    assert any(name.startswith("lookahead/") for name in names)
    for name in names:
        np.testing.assert_array_equal(resumed.get_tensor(name), reader.get_tensor(name), err_msg=name)


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(synthetic_data, tmp_path, caplog):
    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=6, checkpoint_every_steps=3))
    (data_file,) = model_dir.glob("ckpt-6.data-*")
    data_file.write_bytes(data_file.read_bytes()[:100])  # truncated

    with caplog.at_level("INFO"):
        result = loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=8, checkpoint_every_steps=3))

    assert "ckpt-6 is damaged or incompatible" in caplog.text
    assert "at step 3" in caplog.text
    assert result.step == 8


def test_every_checkpoint_damaged_fails_loudly_instead_of_starting_over(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=4, checkpoint_every_steps=2))
    for data_file in model_dir.glob("ckpt-*.data-*"):
        data_file.write_bytes(b"")
    with pytest.raises(CheckpointError, match="refusing to start over from step 0"):
        loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=6))


def test_nan_loss_stops_with_the_step_and_that_state_is_never_checkpointed(synthetic_data, tmp_path, monkeypatch):
    calls = tf.Variable(0, dtype=tf.int64)
    from components.train import step as step_module

    original = step_module.cross_entropy

    def poisoned(labels, logits, num_classes, label_smoothing):
        calls.assign_add(1)
        values = original(labels, logits, num_classes, label_smoothing)
        return values * tf.where(calls >= 4, float("nan"), 1.0)  # from the 4th step on

    monkeypatch.setattr(step_module, "cross_entropy", poisoned)
    model_dir = tmp_path / "model"
    with pytest.raises(loop.NumericsError, match=r"step 4: the loss is NaN or Inf"):
        loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=10, checkpoint_every_steps=1))
    saved = sorted(int(path.name.split("-")[1].split(".")[0]) for path in model_dir.glob("ckpt-*.index"))
    assert saved == [1, 2, 3]
    for step in saved:
        assert np.isfinite(checkpoint_value(model_dir / f"ckpt-{step}", "head/kernel")).all()


TRAINABLE_KINDS = ("kernel", "gamma", "beta", "bias")  # not the batch-norm moving statistics


def one_step_change(synthetic_data, tmp_path, name, start, **overrides):
    """Train one plain-SGD step from the checkpoint `start`; return {variable: value after - value before}."""
    config = tiny_train_config(
        synthetic_data,
        tmp_path / name,
        train_steps=1,
        warm_start=str(start),
        momentum=0.0,
        weight_decay=0.0,
        augment=False,
        shuffle_buffer=1,
        **overrides,
    )
    loop.train(config)
    after = tmp_path / name / "ckpt-1"
    names = [n for n in checkpoints.checkpoint_variable_names(str(after)) if n.endswith(TRAINABLE_KINDS)]
    return {n: checkpoint_value(after, n) - checkpoint_value(start, n) for n in names}


@pytest.fixture
def start_checkpoint(synthetic_data, tmp_path):
    loop.train(tiny_train_config(synthetic_data, tmp_path / "start", train_steps=1))
    return tmp_path / "start" / "ckpt-1"


def test_gradient_multipliers_and_frozen_variables_change_the_update_exactly(
    synthetic_data, tmp_path, start_checkpoint
):
    plain = one_step_change(synthetic_data, tmp_path, "plain", start_checkpoint)
    doubled = one_step_change(
        synthetic_data, tmp_path, "doubled", start_checkpoint, gradient_multipliers=("^head/kernel$=2.0",)
    )
    frozen = one_step_change(synthetic_data, tmp_path, "frozen", start_checkpoint, frozen="^stem_")

    assert np.abs(plain["head/kernel"]).max() > 0
    # Changes are differences of float32 weights of magnitude ~1: exact up to ~1e-7.
    np.testing.assert_allclose(doubled["head/kernel"], 2.0 * plain["head/kernel"], rtol=1e-5, atol=2e-7)
    np.testing.assert_allclose(
        doubled["stage1_block1_conv1/kernel"], plain["stage1_block1_conv1/kernel"], rtol=1e-5, atol=2e-7
    )
    assert not np.any(frozen["stem_conv/kernel"]) and not np.any(frozen["stem_bn/gamma"])
    assert np.any(frozen["head/kernel"])


def test_clipping_by_global_norm_bounds_the_step(synthetic_data, tmp_path, start_checkpoint):
    unit_rate = {"learning_rate": 1.0, "learning_rate_batch_size": 32}  # the rate scales with batch / this
    plain = one_step_change(synthetic_data, tmp_path, "plain", start_checkpoint, **unit_rate)
    clipped = one_step_change(synthetic_data, tmp_path, "clipped", start_checkpoint, clip_global_norm=0.01, **unit_rate)
    plain_norm = np.sqrt(sum(np.sum(change**2) for change in plain.values()))
    clipped_norm = np.sqrt(sum(np.sum(change**2) for change in clipped.values()))
    assert plain_norm > 0.05
    assert clipped_norm == pytest.approx(0.01, rel=1e-3)  # lr 1, plain SGD: the step is the clipped gradient
    for name in plain:
        np.testing.assert_allclose(clipped[name], plain[name] * (0.01 / plain_norm), rtol=1e-3, atol=1e-7)


def test_warm_start_with_a_new_head_for_another_number_of_classes(synthetic_data, tmp_path):
    from components.common.model import ModelSpec, build_resnet
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    loop.train(tiny_train_config(synthetic_data, tmp_path / "source", train_steps=2))
    source = tmp_path / "source" / "ckpt-2"
    five_classes = tmp_path / "five"
    prepare_data(
        PrepareDataConfig(
            output=str(five_classes), source="synthetic", synthetic_classes=5, synthetic_train_per_class=8
        )
    )
    model = build_resnet(ModelSpec(depth=8, width_multiplier=0.25, num_classes=5))
    head_before = model.get_layer("head").kernel.numpy().copy()

    report = checkpoints.warm_start(model.variables, str(tmp_path / "source"), (".*",), ("^head/",), [])

    assert report.source == str(source)
    assert report.skipped == {"head/kernel": "excluded", "head/bias": "excluded"}
    assert "stem_conv/kernel" in report.restored and len(report.restored) == len(model.variables) - 2
    np.testing.assert_array_equal(
        model.get_layer("stem_conv").kernel.numpy(), checkpoint_value(source, "stem_conv/kernel")
    )
    np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), head_before)

    result = loop.train(
        tiny_train_config(
            str(five_classes), tmp_path / "fine", train_steps=2, warm_start=str(source), warm_start_exclude=("^head/",)
        )
    )
    assert result.step == 2


def test_warm_start_that_matches_nothing_is_an_error(synthetic_data, tmp_path):
    from components.common.model import ModelSpec, build_resnet

    loop.train(tiny_train_config(synthetic_data, tmp_path / "source", train_steps=1))
    model = build_resnet(ModelSpec(depth=8, width_multiplier=0.25))
    with pytest.raises(CheckpointError, match=r"no variable matched"):
        checkpoints.warm_start(model.variables, str(tmp_path / "source"), ("^nothing",), (), [])


def test_warm_start_name_mapping(synthetic_data, tmp_path):
    from components.common.model import ModelSpec, build_resnet

    loop.train(tiny_train_config(synthetic_data, tmp_path / "source", train_steps=1))
    model = build_resnet(ModelSpec(depth=8, width_multiplier=0.25))
    report = checkpoints.warm_start(
        model.variables, str(tmp_path / "source"), ("_conv2/",), (), [("block1_conv2/", "block1_conv1/")]
    )
    assert sorted(report.restored) == ["stage1_block1_conv2/kernel"]  # stages 2, 3: conv1 has another shape
    assert "differs from the checkpoint" in report.skipped["stage2_block1_conv2/kernel"]
    np.testing.assert_array_equal(
        model.get_layer("stage1_block1_conv2").kernel.numpy(),
        checkpoint_value(tmp_path / "source" / "ckpt-1", "stage1_block1_conv1/kernel"),
    )


def test_ema_weights_are_saved_beside_the_weights(synthetic_data, tmp_path):
    loop.train(tiny_train_config(synthetic_data, tmp_path / "model", train_steps=5, ema_decay=0.5))
    path = tmp_path / "model" / "ckpt-5"
    weights, averaged = checkpoint_value(path, "head/kernel"), checkpoint_value(path, "head/kernel", "ema")
    assert weights.shape == averaged.shape and not np.array_equal(weights, averaged)
    assert np.abs(weights - averaged).max() < np.abs(weights).max()


@pytest.mark.parametrize(
    "options",
    [
        {"optimizer": "sgd", "nesterov": True},
        {"optimizer": "adam", "learning_rate": 0.001},
        {"optimizer": "adamw", "learning_rate": 0.001},
        {"optimizer": "rmsprop", "learning_rate": 0.001},
        {"in_memory": True, "schedule": "cosine", "warmup_epochs": 0.5, "label_smoothing": 0.1},
        {"precision": "mixed_bfloat16", "xla": True},
        {"precision": "mixed_float16"},
    ],
    ids=["sgd-nesterov", "adam", "adamw", "rmsprop", "in-memory-cosine-warmup-smoothing", "bfloat16-xla", "float16"],
)
def test_every_optimizer_and_option_trains(synthetic_data, tmp_path, options):
    result = loop.train(tiny_train_config(synthetic_data, tmp_path / "model", train_steps=6, **options))
    losses = [value for _step, value in scalar_series(tmp_path / "model" / "train", "loss")]
    assert result.step == 6 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < losses[0] * 1.5  # no blow-up


def test_epochs_set_the_length_from_the_dataset(synthetic_data, tmp_path):
    # 160 training images, batch 32: one epoch is 5 steps.
    result = loop.train(tiny_train_config(synthetic_data, tmp_path / "model", train_steps=None, epochs=2))
    assert result.total_steps == 10 and result.step == 10


def test_a_remote_model_directory_is_written_and_resumed_from(synthetic_data, tmp_path, object_store):
    from components.common import storage

    model_dir = f"{object_store}/runs/1/model"
    publisher_class = type(storage.publisher_for(model_dir))
    uploads = []
    original = publisher_class.publish

    def counting_publish(self, name, data, expected_version=None):
        uploads.append(name.split("/", 2)[2] if name.startswith(".staging/") else name)  # named once it landed
        return original(self, name, data, expected_version)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publisher_class, "publish", counting_publish)
        loop.train(
            tiny_train_config(
                synthetic_data,
                model_dir,
                train_steps=6,
                summary_every_steps=2,
                checkpoint_every_steps=4,
                cache_dir=str(tmp_path / "a"),
            )
        )
    names = storage.publisher_for(model_dir).list()
    assert {"checkpoint", "ckpt-4.index", "config.json", "train_metrics.json"} <= set(names)
    event_files = [name for name in names if name.startswith("train/events.out.tfevents")]
    # Summaries reach the store at every summary interval (steps 2, 4, 6), each event file uploaded once, whole.
    assert len(event_files) >= 3
    assert sorted(name for name in uploads if "tfevents" in name) == sorted(event_files)
    copy = tmp_path / "tensorboard"
    for name in event_files:
        storage.download_file(filesystem.join(model_dir, name), copy / name)
    assert set(step for step, _ in scalar_series(copy / "train", "loss")) == {2, 4, 6}

    # Another machine (an empty cache) resumes from what is in the bucket.
    resumed = loop.train(
        tiny_train_config(
            synthetic_data, model_dir, train_steps=8, checkpoint_every_steps=2, cache_dir=str(tmp_path / "b")
        )
    )
    assert resumed.step == 8 and resumed.checkpoint == f"{model_dir}/ckpt-8"
    assert "ckpt-8.index" in storage.publisher_for(model_dir).list()


def test_checkpoints_by_seconds_keep_only_max_to_keep_and_a_profile_is_written(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    loop.train(
        tiny_train_config(
            synthetic_data, model_dir, train_steps=8, checkpoint_every_seconds=1e-6, max_to_keep=3, profile_steps=(3, 4)
        )
    )
    kept = sorted(int(path.name.split("-")[1].split(".")[0]) for path in model_dir.glob("ckpt-*.index"))
    assert kept == [6, 7, 8]  # saved at every step (the interval had always passed), three kept
    assert list((model_dir / "train" / "plugins" / "profile").rglob("*.xplane.pb"))


def test_tensorboard_mirrors_remote_logs_once_and_reads_them(synthetic_data, tmp_path, s3_bucket):
    from components.common import tensorboard

    model_dir = f"s3://{s3_bucket}/runs/9/model-directory"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=4, summary_every_steps=2))
    local = tmp_path / "mirror"
    first = tensorboard.mirror(model_dir, local)
    assert first >= 2 and set(step for step, _ in scalar_series(local / "train", "loss")) == {2, 4}
    assert not list(local.glob("ckpt-*"))  # logs only, not checkpoints
    assert tensorboard.mirror(model_dir, local) == 0  # nothing new: nothing downloaded again
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=6, summary_every_steps=2))
    assert 1 <= tensorboard.mirror(model_dir, local) < first + 2
    assert set(step for step, _ in scalar_series(local / "train", "loss")) == {2, 4, 6}


@pytest.mark.parametrize("form", ["prefix", "folder"])
def test_warm_start_from_an_s3_checkpoint(synthetic_data, tmp_path, s3_bucket, form):
    """A scheduled run warm-starts from the promoted model's checkpoint, which lives in the object store."""
    source_dir = f"s3://{s3_bucket}/runs/1/model-directory"
    loop.train(tiny_train_config(synthetic_data, source_dir, train_steps=3, cache_dir=str(tmp_path / "a")))
    source = f"{source_dir}/ckpt-3" if form == "prefix" else source_dir
    started = loop.train(
        tiny_train_config(synthetic_data, tmp_path / "new", train_steps=1, warm_start=source, learning_rate=1e-9)
    )
    trained = tf.train.load_checkpoint(str(tmp_path / "new" / "ckpt-1"))
    kernel = next(key for key in checkpoints.checkpoint_variable_names(str(tmp_path / "new" / "ckpt-1")).values()
                  if key.endswith("kernel/.ATTRIBUTES/VARIABLE_VALUE") and "head" in key)  # fmt: skip
    original = tf.train.load_checkpoint(str(next((tmp_path / "a").rglob("ckpt-3.index")).with_suffix("")))
    np.testing.assert_allclose(trained.get_tensor(kernel), original.get_tensor(kernel), atol=1e-6)
    assert started.step == 1


@pytest.mark.parametrize("learning_rate", [1e300, 1e6])
def test_no_checkpoint_ever_holds_a_non_finite_value(synthetic_data, tmp_path, learning_rate):
    """A finite loss and gradient can still make Inf weights or batch-norm variances: the state is checked after
    every update, before anything is saved."""
    model_dir = tmp_path / "model"
    config = tiny_train_config(
        synthetic_data, model_dir, train_steps=40, learning_rate=learning_rate, checkpoint_every_steps=1
    )
    with pytest.raises(loop.NumericsError, match=r"step \d+: .* is NaN or Inf"):
        loop.train(config)
    for index in model_dir.glob("ckpt-*.index"):
        reader = tf.train.load_checkpoint(str(index.with_suffix("")))
        for key in reader.get_variable_to_shape_map():
            value = reader.get_tensor(key)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.isfinite(value).all(), (index.name, key)


@pytest.mark.parametrize("damage", ["missing", "garbage", "out of date"])
def test_a_missing_or_damaged_checkpoint_state_file_never_restarts_training(synthetic_data, tmp_path, caplog, damage):
    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=8, checkpoint_every_steps=2))
    state = model_dir / "checkpoint"
    if damage == "missing":
        state.unlink()
    elif damage == "garbage":
        state.write_bytes(b"\\x00\\xff not a checkpoint state")
    else:
        state.write_text('model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: "ckpt-2"\n')
    with caplog.at_level("INFO"):
        resumed = loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=10, checkpoint_every_steps=2))
    assert resumed.step == 10
    assert "resuming from" in caplog.text and "at step 8" in caplog.text
    assert "rewrote it from the checkpoint files" in caplog.text
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-10")


@pytest.mark.parametrize("state_file", ["intact", "deleted", "out of date"])
def test_a_refused_run_changes_nothing_in_the_model_directory(synthetic_data, tmp_path, state_file):
    from components.train.__main__ import main

    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=2))
    if state_file == "deleted":  # a run that is not refused would rewrite it; a refused one must not
        (model_dir / "checkpoint").unlink()
    elif state_file == "out of date":
        (model_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')

    def model_files():  # the writer's lock records who last held it; nothing else may change
        return {path.name: path.read_bytes() for path in model_dir.iterdir() if path.is_file()} | {".writer.lock": ""}

    before = model_files()
    other_depth = tiny_train_config(synthetic_data, model_dir, train_steps=4, depth=14)
    with pytest.raises(ValueError, match=r"holds checkpoints of another model \(depth 8 there, 14 asked\)"):
        loop.train(other_depth)
    assert main(["--config", json.dumps(config_to_dict(other_depth))]) == 2
    assert model_files() == before


def test_resuming_on_another_dataset_is_refused_unless_asked_and_then_recorded(synthetic_data, tmp_path):
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    other = tmp_path / "other"
    prepare_data(PrepareDataConfig(output=str(other), source="synthetic", synthetic_train_per_class=20, seed=7))
    model_dir = tmp_path / "model"
    first = loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=2))
    config_before = (model_dir / "config.json").read_bytes()
    with pytest.raises(ValueError, match=r"is not the dataset the checkpoints .* were trained on") as refused:
        loop.train(tiny_train_config(str(other), model_dir, train_steps=4))
    assert (model_dir / "config.json").read_bytes() == config_before
    # the way the message gives for a pipeline is one the pipeline takes
    from pipeline.parameters import check_parameters
    from pipeline.training_pipeline import cifar10_pipeline

    options = json.loads(re.search(r"TRAIN_OPTIONS='(\{.*?\})'", str(refused.value)).group(1))
    check_parameters(cifar10_pipeline, {"source": "synthetic", "train_options": options})
    resumed = loop.train(tiny_train_config(str(other), model_dir, train_steps=4, **options))
    assert resumed.step == 4
    recorded = json.loads((model_dir / "config.json").read_text())["resolved"]
    original = json.loads(config_before)["resolved"]["dataset_manifest_sha256"]
    assert recorded["dataset_history"] == [original] and recorded["dataset_manifest_sha256"] != original
    assert first.step == 2


def test_an_empty_train_split_is_refused_before_training(synthetic_data, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    manifest = json.loads((data / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    train.update(num_examples=0, shards=[], class_counts=[0] * len(train["class_counts"]))
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"has no training examples \(its train split is empty\)"):
        loop.train(tiny_train_config(str(data), tmp_path / "model"))
    assert not list((tmp_path / "model").glob("ckpt-*"))


def test_curves_have_a_few_dozen_points_whatever_the_run_length_and_the_validation_split_has_its_own(
    synthetic_data, tmp_path
):
    from components.common.dataset import open_dataset
    from components.train.cadence import resolve

    model_dir = tmp_path / "model"
    chosen = {name: None for name in ("log_every_steps", "summary_every_steps", "histogram_every_steps",
                                      "validation_every_steps", "checkpoint_every_steps")}  # fmt: skip
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=40, **chosen))
    assert [step for step, _ in scalar_series(model_dir / "train", "loss")] == list(range(1, 41))
    validation = scalar_series(model_dir / "validation", "accuracy")
    assert [step for step, _ in validation] == list(range(4, 41, 4))  # ten points, beside the training curve
    assert all(0 <= accuracy <= 1 for _, accuracy in validation)
    assert open_dataset(synthetic_data).manifest.splits["validation"].num_examples > 0
    assert sorted(int(path.name[5:-6]) for path in model_dir.glob("ckpt-*.index")) == [8, 16, 24, 32, 40]
    assert json.loads((model_dir / "config.json").read_text())["resolved"]["cadence"] == {
        "log": 2, "summary": 1, "histogram": 4, "checkpoint": 8, "validation": 4
    }  # fmt: skip
    long_run = resolve(tiny_train_config(synthetic_data, model_dir, **chosen), 80_000)
    assert (long_run.log, long_run.summary, long_run.checkpoint) == (4000, 1600, 16000)


def test_muon_orthogonalises_a_known_matrix_as_its_iteration_acts_on_the_singular_values():
    """The quintic Newton-Schulz iteration maps each singular value s (of the matrix scaled by its Frobenius norm)
    through p(s) = a s + b s^3 + c s^5, three times, and keeps the singular vectors: U p(p(p(S))) V^T."""
    from components.train import optimization

    a, b, c = optimization.NEWTON_SCHULZ_COEFFICIENTS
    rng = np.random.default_rng(0)
    for shape in ((6, 10), (10, 6)):  # wide, and tall (which the iteration transposes)
        matrix = rng.normal(size=shape).astype(np.float64)
        u, singular, vt = np.linalg.svd(matrix, full_matrices=False)
        values = singular / np.linalg.norm(matrix)
        for _ in range(3):
            values = a * values + b * values**3 + c * values**5
        expected = u @ np.diag(values) @ vt
        got = optimization.orthogonalized(tf.constant(matrix, tf.float64), steps=3).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-8)
        assert values.min() > 0.3 and values.max() < 1.3  # near-orthogonal: singular values near 1, not on it
    kernel = rng.normal(size=(3, 3, 4, 8)).astype(np.float32)  # height, width, inputs, outputs
    rows = np.transpose(kernel, (3, 0, 1, 2)).reshape(8, 36)  # one row per output filter
    direction = optimization.muon_direction(tf.constant(kernel), steps=3).numpy()
    expected = optimization.orthogonalized(tf.constant(rows), steps=3).numpy()
    np.testing.assert_allclose(np.transpose(direction, (3, 0, 1, 2)).reshape(8, 36), expected, atol=1e-6)
    renormalized = optimization.renormalized(tf.constant(kernel)).numpy()
    assert np.linalg.norm(renormalized) == pytest.approx(8**0.5, rel=1e-5)


def test_the_muon_recipe_resumed_after_a_crash_ends_where_the_uninterrupted_run_ends(synthetic_data, tmp_path):
    """Muon's momentum is part of the checkpoint; the whitening bias stops at its epoch; the resumed run ends with
    the uninterrupted run's weights and momentum, bit for bit."""
    import shutil

    def muon(model_dir):
        return tiny_train_config(synthetic_data, model_dir, preset="airbench94_muon", width_multiplier=0.125,
                                 batch_size=48, learning_rate_batch_size=48, whitening_bias_epochs=1.0,
                                 train_steps=8, checkpoint_every_steps=5)  # fmt: skip

    first = loop.train(muon(tmp_path / "uninterrupted"))
    assert first.step == 8
    shutil.copytree(tmp_path / "uninterrupted", tmp_path / "crashed")
    for path in (tmp_path / "crashed").glob("ckpt-8.*"):
        path.unlink()
    loop.train(muon(tmp_path / "crashed"))
    reader = tf.train.load_checkpoint(str(tmp_path / "uninterrupted" / "ckpt-8"))
    resumed = tf.train.load_checkpoint(str(tmp_path / "crashed" / "ckpt-8"))
    names = [name for name in reader.get_variable_to_shape_map() if name.startswith(("weights/", "muon/"))]
    assert sum(name.startswith("muon/") for name in names) == 6  # one momentum per convolution kernel
    for name in names:
        np.testing.assert_array_equal(resumed.get_tensor(name), reader.get_tensor(name), err_msg=name)
    # The whitening bias trained for its first epoch (160 images / 48 = 3.3 steps) only.
    early = tf.train.load_checkpoint(str(tmp_path / "uninterrupted" / "ckpt-5"))
    keys = checkpoints.checkpoint_variable_names(str(tmp_path / "uninterrupted" / "ckpt-8"))
    np.testing.assert_array_equal(early.get_tensor(keys["whitening/bias"]), reader.get_tensor(keys["whitening/bias"]))
    assert not np.array_equal(early.get_tensor(keys["head/kernel"]), reader.get_tensor(keys["head/kernel"]))
    kernels = [name for name in keys if "_conv" in name and name.endswith("/kernel")]
    assert len(kernels) == 6
    for name in kernels:  # renormalised to sqrt(outputs) before each step, then moved by an orthogonalised update
        kernel = reader.get_tensor(keys[name])
        assert 0.5 * kernel.shape[-1] ** 0.5 < np.linalg.norm(kernel) < 2 * kernel.shape[-1] ** 0.5
