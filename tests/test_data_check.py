"""statistics.json and the data check, on datasets built to change in one way each.

The base is a folder dataset of four classes, each its own colour and stripes over a smooth background of its own per
image (no two images alike); each variant changes one thing (a class removed, two classes' labels swapped, brightness,
source sizes, planted duplicates and leaks, another JPEG quality). The check must name each change, and find nothing
on an unchanged copy nor on another sample drawn the same way.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest

from components.common import data_statistics
from components.common.data_statistics import DataCheckConfig
from components.common.dataset import read_manifest
from components.evaluate.data_check import CheckDataConfig, DataCheckFailedError, check_data
from components.evaluate.data_check import main as data_check_main
from components.prepare_data import statistics, synthetic
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data

CLASSES = ("apple", "boat", "cloud", "dune")
TRAIN, TEST = 60, 20


def drawn_images(label: int, count: int, seed: int, size: int = 32) -> np.ndarray:
    rng = np.random.default_rng([seed, label])
    prototype = synthetic.class_prototypes(len(CLASSES))[label]
    backgrounds = synthetic.smooth_backgrounds(synthetic.background_waves(count, rng))
    images = []
    for index in range(count):
        down, right = rng.integers(-4, 5, size=2)
        image = np.roll(prototype, (down, right), axis=(0, 1)) + backgrounds[index][..., None]
        image += rng.normal(0, 12, image.shape)
        images.append(np.clip(np.rint(image), 0, 255).astype(np.uint8))
    images = np.stack(images)
    if size != 32:
        import tensorflow as tf

        images = tf.cast(tf.image.resize(images, (size, size)), tf.uint8).numpy()
    return images


def encode(image: np.ndarray, kind: str = "png", quality: int = 95) -> bytes:
    import tensorflow as tf

    if kind == "jpeg":
        return tf.io.encode_jpeg(image, quality=quality).numpy()
    return tf.io.encode_png(image).numpy()


def write_dataset(root, seed=0, classes=CLASSES, kind="png", quality=95, size=32, change=None, labels=None) -> str:
    """root/<split>/<class>/<n>.<kind>; `change(split, label, images)` alters the pixels; `labels` maps a drawn
    class to the folder it is written under (labels moved)."""
    for split, count in (("train", TRAIN), ("test", TEST)):
        for label, name in enumerate(classes):
            images = drawn_images(label, count, seed + (0 if split == "train" else 1000), size)
            if change is not None:
                images = change(split, label, images)
            folder = root / split / (labels or {}).get(name, name)
            folder.mkdir(parents=True, exist_ok=True)
            for index, image in enumerate(images):
                (folder / f"{name}-{index:03d}.{'jpg' if kind == 'jpeg' else 'png'}").write_bytes(
                    encode(image, kind, quality)
                )
    return str(root)


def prepared(tmp_path, name: str, source: str, **options) -> tuple[str, dict]:
    output = str(tmp_path / "prepared" / name)
    prepare_data(PrepareDataConfig(output=output, source=source, validation_fraction=0.0, **options))
    manifest, _digest = read_manifest(output)
    return output, data_statistics.dataset_statistics(output, manifest)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("base")
    return prepared(tmp_path, "base", write_dataset(tmp_path / "source"))


def findings_of(current: dict, reference: dict, **thresholds) -> list[data_statistics.Finding]:
    return data_statistics.check(current, reference, DataCheckConfig(**thresholds))


def kinds(findings) -> set[str]:
    return {finding.kind for finding in findings if finding.severity == data_statistics.ERROR}


# -- the statistics ------------------------------------------------------------------------------------------------


def test_statistics_describe_the_dataset_beside_its_manifest(base):
    dataset, described = base
    manifest, _digest = read_manifest(dataset)
    assert manifest.statistics["path"] == "statistics.json"
    train = described["splits"]["train"]
    assert described["label_names"] == sorted(CLASSES)
    assert train["count"] == TRAIN * len(CLASSES) and train["class_counts"] == [TRAIN] * len(CLASSES)
    assert train["source_sizes"] == {"32x32": TRAIN * len(CLASSES)} and train["source_aspect_ratios"] == {"1:1": 240}
    assert train["converted_to_rgb"] == {}
    assert all(40 < mean < 215 for mean in train["channel_mean"]) and all(std > 10 for std in train["channel_std"])
    assert described["leakage"] == {"eval": 0}
    assert all(comparison["near_duplicate_pairs"] == 0 for comparison in described["duplicates"])


def test_near_duplicates_survive_jpeg_a_shift_and_brightness_and_unrelated_images_are_not_paired():
    images = np.concatenate([drawn_images(label, 30, seed=5) for label in range(len(CLASSES))])
    import tensorflow as tf

    def descriptor(batch):
        return statistics.descriptors(batch.astype(np.float32))

    originals = descriptor(images)
    changed = {
        "JPEG quality 40": np.stack([tf.io.decode_jpeg(encode(image, "jpeg", 40)).numpy() for image in images]),
        "a one-pixel shift right": np.concatenate([images[:, :, :1], images[:, :, :-1]], axis=2),  # edge repeated
        "a one-pixel shift down": np.concatenate([images[:, :1], images[:, :-1]], axis=1),
        "brighter by 30": np.clip(images.astype(int) + 30, 0, 255).astype(np.uint8),
        "contrast 0.8": np.clip((images.astype(float) - 128) * 0.8 + 128, 0, 255).astype(np.uint8),
    }
    for name, variant in changed.items():
        similarity = (originals * descriptor(variant)).sum(axis=1)
        kept = np.mean(similarity >= statistics.NEAR_DUPLICATE_THRESHOLD)
        assert kept >= 0.9, f"{name}: only {kept:.0%} stay near-duplicates of their original"
    left, _right, _similarity = statistics.near_duplicate_pairs(originals)
    assert len(left) == 0, "distinct images are not near-duplicates"


def test_the_cell_search_finds_what_comparing_every_pair_finds():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((12_000, 63)).astype(np.float32)
    planted = rng.choice(len(features), 300, replace=False)
    copies = features[planted] + 0.15 * rng.standard_normal((300, 63)).astype(np.float32)  # cosine about 0.99
    features = np.concatenate([features, copies])
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    exhaustive = set(zip(*(part.tolist() for part in statistics._pairs_exhaustive(features, 0.9)[:2]), strict=True))
    left, right, _similarity = statistics.near_duplicate_pairs(features)
    found = set(zip(left.tolist(), right.tolist(), strict=True))
    assert len(exhaustive) >= 300 and found <= exhaustive
    assert len(found) >= 0.97 * len(exhaustive)


def test_past_its_cells_the_search_adds_cells_and_still_finds_the_pairs(monkeypatch):
    """Scaled down: one cell for every 100 images, and past 16 cells an image's nearest found among the cells of
    its nearest groups of cells: 12,300 images search in 123 cells of about 100 (in 12 groups), each image compared
    with 6 of them, and find what comparing every pair finds."""
    monkeypatch.setattr(statistics, "CELL_IMAGES", 100)
    monkeypatch.setattr(statistics, "FLAT_CELLS", 16)
    monkeypatch.setattr(statistics, "SCORE_ELEMENTS", 50_000)  # the scores in blocks too
    made = []
    centres_of = statistics._cell_centres
    monkeypatch.setattr(
        statistics, "_cell_centres", lambda *arguments: made.append(arguments[2]) or centres_of(*arguments)
    )
    rng = np.random.default_rng(1)
    features = rng.standard_normal((12_000, 63)).astype(np.float32)
    planted = rng.choice(len(features), 300, replace=False)
    features = np.concatenate([features, features[planted] + 0.15 * rng.standard_normal((300, 63)).astype(np.float32)])
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    exhaustive = set(zip(*(part.tolist() for part in statistics._pairs_exhaustive(features, 0.9)[:2]), strict=True))
    left, right, _similarity = statistics.near_duplicate_pairs(features)
    found = set(zip(left.tolist(), right.tolist(), strict=True))
    assert made == [123, 12]  # the cells, then their groups
    assert len(exhaustive) >= 300 and found <= exhaustive
    assert len(found) >= 0.97 * len(exhaustive)


def test_planted_duplicates_and_leaks_are_counted_and_named(tmp_path):
    def plant(split, label, images):
        if split == "train" and label == 0:  # 5 test images of class 0, re-encoded at JPEG 70, also in training
            test = drawn_images(0, TEST, 1000)
            decoded = [_jpeg_round_trip(image, 70) for image in test[:5]]
            images = np.concatenate([images[:-7], np.stack(decoded), images[:2]])  # and 2 exact copies in training
        return images

    _dataset, described = prepared(tmp_path, "leaky", write_dataset(tmp_path / "source", change=plant))
    assert described["leakage"] == {"eval": 5}
    leaking = set(described["leaking_ids"]["eval"])
    assert leaking == {f"test/apple/apple-{index:03d}.png" for index in range(5)}
    within = next(c for c in described["duplicates"] if c["split"] == c["other"] == "train")
    assert within["exact_duplicate_pairs"] == 2
    exact = {(pair["id"], pair["other_id"]) for pair in within["pairs"] if pair["exact"]}
    assert ("train/apple/apple-000.png", "train/apple/apple-058.png") in exact


def _jpeg_round_trip(image: np.ndarray, quality: int) -> np.ndarray:
    import tensorflow as tf

    return tf.io.decode_jpeg(encode(image, "jpeg", quality)).numpy()


def test_leaking_images_can_be_removed_from_training_or_from_the_evaluation(tmp_path):
    def plant(split, label, images):
        if split == "train" and label == 1:
            return np.concatenate([images[:-4], drawn_images(1, TEST, 1000)[:4]])
        return images

    source = write_dataset(tmp_path / "source", change=plant)
    _dataset, kept = prepared(tmp_path, "kept", source)
    _dataset, from_train = prepared(tmp_path, "from-train", source, leakage="drop_from_train")
    _dataset, from_eval = prepared(tmp_path, "from-eval", source, leakage="drop_from_eval")
    assert kept["leakage"] == {"eval": 4}
    assert from_train["leakage"] == {"eval": 0} and from_eval["leakage"] == {"eval": 0}
    assert from_train["splits"]["train"]["count"] == TRAIN * 4 - 4 and from_train["splits"]["eval"]["count"] == 80
    assert from_eval["splits"]["eval"]["count"] == TEST * 4 - 4 and from_eval["splits"]["train"]["count"] == 240
    assert from_train["leakage_removed"] == {
        "mode": "drop_from_train",
        "leakage_before": {"eval": 4},
        "images_removed": {"train": 4},
    }


def test_sizes_and_colour_conversions_are_those_of_the_source_before_any_resize(tmp_path):
    import tensorflow as tf

    source = tmp_path / "source"
    write_dataset(source, size=48)
    gray = tf.io.encode_png(np.full((20, 40, 1), 90, np.uint8)).numpy()
    (source / "train" / "apple" / "gray.png").write_bytes(gray)
    _dataset, described = prepared(tmp_path, "resized", str(source), resize="32")
    train = described["splits"]["train"]
    assert train["source_sizes"] == {"48x48": 240, "40x20": 1}
    assert train["source_aspect_ratios"] == {"1:1": 240, "2:1": 1}
    assert train["converted_to_rgb"] == {"grayscale": 1}


# -- the check ------------------------------------------------------------------------------------------------------


def test_an_unchanged_copy_and_another_sample_give_no_finding(tmp_path, base):
    _dataset, reference = base
    _dataset, again = prepared(tmp_path, "again", write_dataset(tmp_path / "again"))
    _dataset, other = prepared(tmp_path, "other", write_dataset(tmp_path / "other", seed=7))
    assert findings_of(again, reference) == []
    assert findings_of(other, reference) == []


def test_a_faithful_jpeg_copy_gives_no_error_and_a_hard_compressed_one_is_named_as_less_detail(tmp_path, base):
    _dataset, reference = base
    _dataset, faithful = prepared(tmp_path, "jpeg95", write_dataset(tmp_path / "jpeg95", kind="jpeg", quality=95))
    assert kinds(findings_of(faithful, reference)) == set()
    _dataset, hard = prepared(tmp_path, "jpeg40", write_dataset(tmp_path / "jpeg40", kind="jpeg", quality=40))
    (detail,) = [finding for finding in findings_of(hard, reference) if finding.split == "train"]
    assert detail.kind == "detail" and detail.setting == "detail_change" and detail.value < 0
    assert "less fine detail: blurred, upscaled from a lower resolution, or compressed harder" in detail.message


def test_a_removed_class_is_named(tmp_path, base):
    _dataset, reference = base
    _dataset, fewer = prepared(tmp_path, "fewer", write_dataset(tmp_path / "fewer", classes=CLASSES[:3]))
    findings = findings_of(fewer, reference)
    assert "class_missing" in kinds(findings)
    assert any("'dune'" in finding.message for finding in findings if finding.kind == "class_missing")


def test_swapped_labels_of_two_classes_are_found_though_the_counts_are_unchanged(tmp_path, base):
    _dataset, reference = base
    swapped = write_dataset(tmp_path / "swapped", labels={"apple": "boat", "boat": "apple"})
    _dataset, moved = prepared(tmp_path, "swapped", swapped)
    assert moved["splits"]["train"]["class_counts"] == reference["splits"]["train"]["class_counts"]
    findings = [finding for finding in findings_of(moved, reference) if finding.kind == "labels_moved"]
    assert {finding.message.split("'")[1] for finding in findings} >= {"apple", "boat"}
    assert "look more like the reference's 'boat'" in " ".join(finding.message for finding in findings)


def test_a_brightness_shift_is_measured_in_standard_deviations(tmp_path, base):
    _dataset, reference = base

    def brighter(split, label, images):
        return np.clip(images.astype(int) + 30, 0, 255).astype(np.uint8)

    _dataset, bright = prepared(tmp_path, "bright", write_dataset(tmp_path / "bright", change=brighter))
    findings = findings_of(bright, reference)
    shifts = [finding for finding in findings if finding.kind == "brightness"]
    assert [finding.split for finding in shifts] == ["train", "eval"] and all(0.3 < f.value < 1.0 for f in shifts)
    assert "brighter images: mean luminance" in shifts[0].message and "standard deviations" in shifts[0].message
    assert shifts[0].setting == "channel_mean_shift" and "channel_mean_shift" in shifts[0].line()
    assert not [finding for finding in findings if finding.kind in ("labels_moved", "label_noise")]  # the look moved
    relaxed = {name: 9.0 for name in ("channel_mean_shift", "channel_spread_change", "class_look_change",
               "saturation_change", "colour_shift", "detail_change", "layout_change")}  # fmt: skip
    assert findings_of(bright, reference, **relaxed) == []


def test_changed_source_sizes_are_a_warning(tmp_path, tmp_path_factory):
    reference_source = write_dataset(tmp_path / "small", size=32)
    _dataset, reference = prepared(tmp_path, "small", reference_source, resize="32")
    _dataset, larger = prepared(tmp_path, "large", write_dataset(tmp_path / "large", size=64), resize="32")
    findings = findings_of(larger, reference)
    sizes = [finding for finding in findings if finding.kind == "image_sizes"]
    assert sizes and sizes[0].severity == data_statistics.WARNING and "64x64" in sizes[0].message


def test_a_rise_in_leakage_is_an_error_and_without_a_reference_leakage_is_still_said(tmp_path, base):
    _dataset, reference = base

    def plant(split, label, images):
        if split == "train":
            return np.concatenate([images[:-3], drawn_images(label, TEST, 1000)[:3]])
        return images

    _dataset, leaky = prepared(tmp_path, "leaky", write_dataset(tmp_path / "leaky", change=plant))
    findings = findings_of(leaky, reference)
    assert "leakage" in kinds(findings)
    alone = data_statistics.check(leaky, None, DataCheckConfig())
    assert [finding.kind for finding in alone] == ["leakage"] and "12 of the 80 eval images" in alone[0].message


# -- the check's step: modes, reference, bad input ------------------------------------------------------------------


def test_modes_warn_block_and_fail(tmp_path, base):
    reference_dataset, _reference = base

    def brighter(split, label, images):
        return np.clip(images.astype(int) + 40, 0, 255).astype(np.uint8)

    changed, _statistics = prepared(tmp_path, "bright", write_dataset(tmp_path / "bright", change=brighter))
    warned = check_data(CheckDataConfig(data=changed, reference=reference_dataset, mode="warn"))
    assert warned.blocking == "" and warned.findings
    blocked = check_data(CheckDataConfig(data=changed, reference=reference_dataset, mode="block"))
    assert blocked.blocking.startswith("data check: train: brighter images: mean luminance")
    with pytest.raises(DataCheckFailedError, match="data check: train: brighter images: mean luminance"):
        check_data(CheckDataConfig(data=changed, reference=reference_dataset, mode="fail"))
    unchanged = check_data(CheckDataConfig(data=reference_dataset, reference=reference_dataset, mode="fail"))
    assert unchanged.findings == [] and unchanged.blocking == ""


def test_the_command_line_exits_2_with_one_line_on_a_damaged_statistics_file(tmp_path, base, capsys):
    dataset, _statistics = base
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(dataset, copy)
    described = json.loads((copy / "statistics.json").read_text())
    described["splits"]["train"]["channel_std"] = [1, 2, "wide"]
    (copy / "statistics.json").write_text(json.dumps(described))
    assert data_check_main(["--data", str(copy)]) == 2
    assert "not the statistics its manifest was published with" in capsys.readouterr().err
    (copy / "manifest.json").write_text((copy / "manifest.json").read_text())  # the manifest as it was
    assert data_check_main(["--data", dataset, "--reference", str(copy / "statistics.json")]) == 2
    assert "splits.train.channel_std[2]" in capsys.readouterr().err
    described = json.loads((Path(dataset) / "statistics.json").read_text())
    described["splits"]["eval"]["class_per_image"]["std"].pop()  # one class's measures gone
    (copy / "statistics.json").write_text(json.dumps(described))
    assert data_check_main(["--data", dataset, "--reference", str(copy / "statistics.json")]) == 2
    error = capsys.readouterr().err
    classes = len(described["label_names"])
    assert f"splits.eval.class_per_image.std: {classes - 1} entries for {classes} classes" in error
    assert len(error.splitlines()) == 1
    assert data_check_main(["--data", dataset, "--reference", str(tmp_path / "nothing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert data_check_main(["--data", dataset, "--thresholds", '{"channel_mean_shift": -1}']) == 2
    assert "thresholds: channel_mean_shift: -1 is not in (0, 100]" in capsys.readouterr().err


# -- a scheduled retraining run: the promoted model's data is the reference ------------------------------------------


def trained_model(tmp_path, name: str, dataset: str) -> str:
    from components.train import loop
    from tests.builders import tiny_train_config

    model_dir = tmp_path / name
    loop.train(tiny_train_config(dataset, model_dir, train_steps=6))
    return str(model_dir)


def test_a_scheduled_run_on_changed_data_is_not_promoted_and_on_unchanged_data_is(tmp_path, base):
    """What `schedule` runs (data_check block): the first promotion records its training data's statistics; a later
    run on brighter images is not promoted, the decision naming the finding; a run on another sample of the same
    data is."""
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate

    first_data, _statistics = base
    root = str(tmp_path / "models")
    first = evaluate(EvaluateConfig(data=first_data, model_dir=trained_model(tmp_path, "first", first_data),
                                    promote_to=root, baseline_tolerance=1.0))  # fmt: skip
    assert first.promotion.version == 1
    recorded = data_statistics.read_statistics(f"{root}/1/{data_statistics.PROMOTED_STATISTICS}")
    assert recorded["splits"]["train"]["count"] == TRAIN * len(CLASSES)

    def brighter(split, label, images):
        return np.clip(images.astype(int) + 40, 0, 255).astype(np.uint8)

    runs = {
        "changed": prepared(tmp_path, "changed", write_dataset(tmp_path / "changed", seed=3, change=brighter))[0],
        "unchanged": prepared(tmp_path, "unchanged", write_dataset(tmp_path / "unchanged", seed=3))[0],
    }
    outcomes = {}
    for name, data in runs.items():
        checked = check_data(CheckDataConfig(data=data, mode="block", promotion_root=root))
        assert checked.reference == "the training data of promoted version 1"
        outcomes[name] = evaluate(
            EvaluateConfig(data=data, model_dir=trained_model(tmp_path, name, data), promote_to=root,
                           baseline_tolerance=1.0, data_blocking=checked.blocking or None)
        )  # fmt: skip
    changed, unchanged = outcomes["changed"], outcomes["unchanged"]
    assert not changed.decision.blessed and changed.promotion is None
    assert changed.decision.reasons[-1].startswith(
        "promotion blocked by the data check (data_check block): train: brighter images: mean luminance"
    )
    assert changed.decision.reasons[-1] in html.unescape(changed.report_html)
    assert unchanged.decision.blessed and unchanged.promotion.version == 2
    assert "Class balance of the eval split" in unchanged.report_html  # the report's data section
    # with pictures of how the images look: five histograms and the classes' mean images, the reference's and these
    shown = changed.report_html[changed.report_html.index("How the eval images look") :]
    assert shown.count('<img src="data:image/png;base64,') >= 7 and "each class's mean image" in shown


def test_the_report_shows_the_accuracy_without_the_leaking_images_and_the_pairs(tmp_path):
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate

    def plant(split, label, images):
        if split == "train":
            return np.concatenate([images[:-2], drawn_images(label, TEST, 1000)[:2]])
        return images

    data, described = prepared(tmp_path, "leaky", write_dataset(tmp_path / "leaky", change=plant))
    assert described["leakage"] == {"eval": 8}
    result = evaluate(EvaluateConfig(data=data, model_dir=trained_model(tmp_path, "model", data)))
    from components.common.dataset import open_dataset

    ids, labels = [], []
    for _images, batch_labels, batch_ids in open_dataset(data).tf_dataset("eval", 1000, with_ids=True):
        ids += [example_id.decode() for example_id in batch_ids.numpy()]
        labels += batch_labels.numpy().tolist()
    kept = ~np.isin(ids, described["leaking_ids"]["eval"])
    right = result.final.probabilities.argmax(1) == np.array(labels)
    assert result.without_leaks == {"accuracy": pytest.approx(right[kept].mean()), "leaking_images": 8}
    page = result.report_html
    assert "without the 8 that have a near-duplicate in the training split" in page
    assert page.count('alt="its training near-duplicate"') == 8 and page.count('alt="test image"') == 8


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--data-check", "stop", "data_check: 'stop' is not one of warn, block, fail"),
        ("--data-thresholds", '{"brightness": 1}', "data_thresholds: 'brightness' is not a threshold"),
        ("--data-thresholds", '{"leakage_rate_change": 2}', "data_thresholds: leakage_rate_change: 2 is not in (0, 1]"),
        ("--leakage", "drop", "leakage: 'drop' is not one of keep, drop_from_train, drop_from_eval"),
    ],
)
def test_bad_data_parameters_are_refused_before_anything_runs(tmp_path, capsys, option, value, message):
    from pipeline import commands
    from pipeline.training_pipeline import cifar10_pipeline

    code = commands.main(cifar10_pipeline, ["local-run", "--output-root", str(tmp_path), option, value])
    assert code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing ran"


def test_the_check_reads_statistics_from_an_object_store(tmp_path, s3_bucket):
    """A dataset and a reference prepared into s3://, as a cluster run has them."""
    bucket = f"s3://{s3_bucket}"
    source = write_dataset(tmp_path / "source")
    prepare_data(PrepareDataConfig(output=f"{bucket}/reference", source=source, validation_fraction=0.0))

    def brighter(split, label, images):
        return np.clip(images.astype(int) + 40, 0, 255).astype(np.uint8)

    changed = write_dataset(tmp_path / "changed", change=brighter)
    prepare_data(PrepareDataConfig(output=f"{bucket}/changed", source=changed, validation_fraction=0.0))
    same = check_data(CheckDataConfig(data=f"{bucket}/reference", reference=f"{bucket}/reference", mode="fail"))
    assert same.findings == []
    with pytest.raises(DataCheckFailedError, match="brighter images"):
        check_data(CheckDataConfig(data=f"{bucket}/changed", reference=f"{bucket}/reference/statistics.json",
                                   mode="fail"))  # fmt: skip
