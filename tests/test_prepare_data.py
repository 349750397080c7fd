"""prepare_data on good input: pixels survive, splits are right, shards verify, reruns do no work."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from components.common import dataset as dataset_module
from components.common import filesystem, stores
from components.common.dataset import DatasetError, open_dataset, read_manifest
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
from tests import builders


def prepare(tmp_path, source, output_name="out", **options):
    output = tmp_path / output_name
    return prepare_data(PrepareDataConfig(output=str(output), source=str(source), **options)), output


def all_records(output, splits=("train", "validation", "eval")):
    verified = open_dataset(str(output))
    return {split: builders.read_records(verified.files[split], verified.manifest.compression) for split in splits}


def test_python_archive_round_trip_is_pixel_exact_with_planes_transposed_to_hwc(tmp_path):
    official = builders.official_data(per_batch=20)
    archive = builders.write_python_archive(tmp_path / "cifar-10-python.tar.gz", official)

    result, output = prepare(tmp_path, archive)

    parsed = all_records(output)
    assert {split: len(records) for split, records in parsed.items()} == {"train": 80, "validation": 20, "eval": 20}
    # The estimator example's splits: batches 1-4 train, batch 5 validation, test batch eval.
    assert {example_id.split("/")[0] for example_id in parsed["train"]} == {f"data_batch_{i}" for i in range(1, 5)}
    assert {example_id.split("/")[0] for example_id in parsed["validation"]} == {"data_batch_5"}
    assert {example_id.split("/")[0] for example_id in parsed["eval"]} == {"test_batch"}
    for records in parsed.values():
        for example_id, (image, label) in records.items():
            np.testing.assert_array_equal(image, official.image_hwc(example_id))
            assert label == official.label(example_id)
    # Spelled out once: the first 1024 values are the red plane, row-major; pixel (0, 1) is red value 1.
    image, _label = parsed["train"]["data_batch_1/00000"]
    row = official.data["data_batch_1"][0]
    assert image[0, 1, 0] == row[1] and image[0, 1, 1] == row[1024 + 1] and image[0, 1, 2] == row[2048 + 1]
    assert image[1, 0, 2] == row[2048 + 32]
    assert result.manifest.label_names == builders.LABEL_NAMES
    assert result.manifest.dataset == "cifar10" and not result.manifest.synthetic


def test_binary_archive_round_trip_is_pixel_exact(tmp_path):
    official = builders.official_data(per_batch=15, seed=1)
    archive = builders.write_binary_archive(tmp_path / "cifar-10-binary.tar.gz", official)

    result, output = prepare(tmp_path, archive)

    parsed = all_records(output)
    assert result.manifest.source["format"] == "binary"
    assert sum(len(records) for records in parsed.values()) == 6 * 15
    for records in parsed.values():
        for example_id, (image, label) in records.items():
            np.testing.assert_array_equal(image, official.image_hwc(example_id))
            assert label == official.label(example_id)


@pytest.mark.parametrize("as_tarball", [False, True], ids=["folder", "tarball"])
def test_class_folders_round_trip_is_pixel_exact(tmp_path, as_tarball):
    images = builders.write_class_folders(tmp_path / "images", {"train": 5, "test": 2})
    source = tmp_path / "images"
    if as_tarball:
        source = builders.tar_folder(source, tmp_path / "images.tar.gz", top="my-data/")

    result, output = prepare(tmp_path, source, validation_fraction=0.4)

    parsed = all_records(output)
    assert result.manifest.label_names == ["cat", "dog", "frog"]
    assert result.manifest.dataset == "images"
    assert result.manifest.splits["validation"].class_counts == [2, 2, 2]  # stratified: 40% of 5 per class
    assert result.manifest.splits["train"].class_counts == [3, 3, 3]
    prefix = "my-data/" if as_tarball else ""
    for records in parsed.values():
        for example_id, (image, label) in records.items():
            relative = example_id.removeprefix(prefix)
            np.testing.assert_array_equal(image, images[relative])
            assert result.manifest.label_names[label] == relative.split("/")[1]


@pytest.mark.parametrize("as_tarball", [False, True], ids=["folder", "tarball"])
def test_what_tools_and_operating_systems_leave_among_the_images_is_skipped(tmp_path, as_tarball):
    """A notebook's .ipynb_checkpoints/ in a split folder had become a class; a .git/ or a Mac's __MACOSX/ beside the
    split folders made 'several roots'; a Windows Thumbs.db in a class folder was 'not a JPEG or PNG image'. Each is
    skipped: the dataset is the class folders' images alone."""
    root = tmp_path / "images"
    images = builders.write_class_folders(root, {"train": 3, "test": 1})
    image = (root / "train" / "cat" / "0000.png").read_bytes()
    left = {
        "train/.ipynb_checkpoints/0000-checkpoint.png": image,
        "test/dog/.ipynb_checkpoints/0000-checkpoint.png": image,
        ".git/train/objects/ab": b"git object",
        "__MACOSX/train/cat/._0000.png": b"\x00\x05\x16\x07",
        "train/cat/Thumbs.db": b"\xd0\xcf\x11\xe0" + bytes(60),
        "test/frog/desktop.ini": b"[.ShellClassInfo]",
        "train/dog/.DS_Store": b"\x00\x00\x00\x01Bud1",
    }
    for name, content in left.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    source = builders.tar_folder(root, tmp_path / "images.tar.gz") if as_tarball else root

    result, output = prepare(tmp_path, source, validation_fraction=0.0)

    assert result.manifest.label_names == ["cat", "dog", "frog"]
    read = {example_id for records in all_records(output, ("train", "eval")).values() for example_id in records}
    assert read == set(images)


def test_split_folders_in_capitals_are_read_and_a_class_without_test_images_is_said(tmp_path, caplog):
    root = tmp_path / "images"
    builders.write_class_folders(root, {"train": 2, "test": 1})
    (root / "train").rename(root / "Train")
    (root / "test").rename(root / "TEST")
    for image in (root / "TEST" / "frog").iterdir():
        image.unlink()
    (root / "TEST" / "frog").rmdir()

    result, _output = prepare(tmp_path, root, validation_fraction=0.0)

    assert result.manifest.label_names == ["cat", "dog", "frog"]
    assert result.manifest.splits["eval"].class_counts == [1, 1, 0]
    assert "class(es) ['frog'] have no test images: their accuracy will not be measured" in caplog.text


def test_jpeg_class_folders_decode(tmp_path):
    import tensorflow as tf

    folder = tmp_path / "images" / "train" / "cat"
    folder.mkdir(parents=True)
    (tmp_path / "images" / "test" / "cat").mkdir(parents=True)
    flat = np.full((32, 32, 3), 120, np.uint8)
    for path in (folder / "a.jpg", tmp_path / "images" / "test" / "cat" / "b.jpeg"):
        path.write_bytes(tf.io.encode_jpeg(flat, quality=100).numpy())

    _result, output = prepare(tmp_path, tmp_path / "images", validation_fraction=0.0)

    (image, label) = next(iter(all_records(output, ("train",))["train"].values()))
    assert label == 0 and np.abs(image.astype(int) - 120).max() <= 2


def test_synthetic_data_is_named_deterministic_and_learnable_shaped(tmp_path):
    first, output = prepare(tmp_path, "synthetic", "a", synthetic_train_per_class=10, synthetic_eval_per_class=4)
    second, other = prepare(tmp_path, "synthetic", "b", synthetic_train_per_class=10, synthetic_eval_per_class=4)

    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["synthetic"] is True and manifest["dataset"] == "synthetic"
    assert all(name.startswith("synthetic") for name in manifest["label_names"])
    assert manifest["source"]["uri"] == "synthetic"
    assert first.manifest_sha256 == second.manifest_sha256
    for shard in (output / "train").iterdir():
        assert shard.read_bytes() == (other / "train" / shard.name).read_bytes()
    # Classes differ on average far more than images of one class do: the data carries its labels.
    records = all_records(output, ("train",))["train"].values()
    images = np.stack([image for image, _ in records]).astype(float)
    labels = np.array([label for _, label in records])
    means = np.stack([images[labels == label].mean(axis=0) for label in range(10)])
    assert np.abs(means[0] - means[5]).mean() > 20


def test_validation_fraction_is_stratified_and_seeded(tmp_path):
    official = builders.official_data(per_batch=50)
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", official)

    first, _ = prepare(tmp_path, archive, "a", validation_fraction=0.2, seed=7)
    again, _ = prepare(tmp_path, archive, "b", validation_fraction=0.2, seed=7)
    other, _ = prepare(tmp_path, archive, "c", validation_fraction=0.2, seed=8)

    # 25 examples of each class across the five batches; 20% of each, drawn from all batches.
    assert first.manifest.splits["validation"].class_counts == [5] * 10
    assert first.manifest.splits["train"].class_counts == [20] * 10
    assert first.manifest_sha256 == again.manifest_sha256
    assert first.manifest.splits["validation"].shards[0].sha256 != other.manifest.splits["validation"].shards[0].sha256


def test_no_validation_split_when_fraction_is_zero(tmp_path):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=10))
    result, _ = prepare(tmp_path, archive, validation_fraction=0.0)
    assert sorted(result.manifest.splits) == ["eval", "train"]
    assert result.manifest.splits["train"].num_examples == 50


def test_sharding_and_gzip(tmp_path):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))

    result, output = prepare(tmp_path, archive, examples_per_shard=30, compression="GZIP")

    train = result.manifest.splits["train"]
    assert [shard.num_records for shard in train.shards] == [30, 30, 20]
    key = train.shards[0].path.split("-")[1]
    assert [shard.path for shard in train.shards] == [
        f"train/train-{key}-0000{i}-of-00003.tfrecord.gz" for i in range(3)
    ]
    assert all(path.name.endswith(".tfrecord.gz") for path in (output / "train").iterdir())
    parsed = all_records(output)
    assert len(parsed["train"]) == 80 and len(parsed["eval"]) == 20


def test_manifest_lists_counts_and_checksums_that_match_the_files(tmp_path):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))
    result, output = prepare(tmp_path, archive, examples_per_shard=25)

    manifest = json.loads((output / "manifest.json").read_text())
    import hashlib

    assert manifest["source"]["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert manifest["parameters"]["examples_per_shard"] == 25
    for split in manifest["splits"].values():
        assert sum(split["class_counts"]) == split["num_examples"] == sum(s["num_records"] for s in split["shards"])
        for shard in split["shards"]:
            content = (output / shard["path"]).read_bytes()
            assert hashlib.sha256(content).hexdigest() == shard["sha256"] and len(content) == shard["size_bytes"]
    assert result.manifest_sha256 == hashlib.sha256((output / "manifest.json").read_bytes()).hexdigest()


def test_rerun_with_same_inputs_does_no_work_and_forced_rerun_is_byte_identical(tmp_path, monkeypatch):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))
    first, output = prepare(tmp_path, archive)
    shards = sorted(output.rglob("*.tfrecord"))
    before = {path: (path.read_bytes(), os.stat(path).st_mtime_ns) for path in shards}

    def fail_if_called(*_args, **_kwargs):
        raise AssertionError("the source was read again although the published dataset matched")

    monkeypatch.setattr("components.prepare_data.prepare.read_source", fail_if_called)
    second, _ = prepare(tmp_path, archive)
    assert second.reused and second.manifest_sha256 == first.manifest_sha256
    assert all(os.stat(path).st_mtime_ns == before[path][1] for path in shards)
    monkeypatch.undo()

    forced, _ = prepare(tmp_path, archive, force=True)
    assert not forced.reused and forced.manifest_sha256 == first.manifest_sha256
    assert all(path.read_bytes() == before[path][0] for path in shards)


def test_changed_options_rewrite_and_remove_stale_shards(tmp_path):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))
    _first, output = prepare(tmp_path, archive, examples_per_shard=10)
    assert len(list((output / "train").iterdir())) == 8

    second, _ = prepare(tmp_path, archive, examples_per_shard=40)

    assert not second.reused
    expected = sorted(shard.path for split in second.manifest.splits.values() for shard in split.shards)
    assert sorted(path.relative_to(output).as_posix() for path in output.rglob("*.tfrecord")) == expected
    assert [shard.path.endswith("-of-00002.tfrecord") for shard in second.manifest.splits["train"].shards] == [True] * 2
    open_dataset(str(output))


def test_a_damaged_shard_is_repaired_by_a_rerun(tmp_path):
    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))
    first, output = prepare(tmp_path, archive)
    shard = output / first.manifest.splits["train"].shards[0].path
    shard.write_bytes(shard.read_bytes()[:-10])

    second, _ = prepare(tmp_path, archive)

    assert not second.reused
    open_dataset(str(output))


def only_shard(output, split):
    (shard,) = (output / split).iterdir()
    return shard


class TestVerification:
    @pytest.fixture
    def output(self, tmp_path):
        archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=20))
        return prepare(tmp_path, archive)[1]

    def test_truncated_shard(self, output):
        shard = only_shard(output, "train")
        shard.write_bytes(shard.read_bytes()[:-100])
        with pytest.raises(DatasetError, match=rf"{shard.name}: has [\d,]+ bytes, manifest says [\d,]+ \(truncated"):
            open_dataset(str(output))

    def test_tampered_pixel(self, output):
        shard = only_shard(output, "eval")
        content = bytearray(shard.read_bytes())
        content[500] ^= 0xFF
        shard.write_bytes(bytes(content))
        with pytest.raises(DatasetError, match=rf"{shard.name}: SHA-256 .* does not match"):
            open_dataset(str(output))

    def test_record_count_differs_from_manifest(self, output):
        manifest = json.loads((output / "manifest.json").read_text())
        manifest["splits"]["eval"]["shards"][0]["num_records"] = 19
        manifest["splits"]["eval"]["num_examples"] = 19
        manifest["splits"]["eval"]["class_counts"][0] -= 1
        (output / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DatasetError, match=r"holds 20 records, manifest says 19"):
            open_dataset(str(output), splits=("eval",))

    def test_per_class_counts_differ_from_the_records_with_the_same_sum(self, output):
        manifest = json.loads((output / "manifest.json").read_text())
        counts = manifest["splits"]["train"]["class_counts"]
        counts[0], counts[1] = counts[0] + 1, counts[1] - 1  # the sum still matches
        (output / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(
            DatasetError, match=r"split 'train' holds other per-class counts than its manifest says: airplane \d+"
        ):
            open_dataset(str(output), splits=("train",))

    def test_missing_shard_and_missing_manifest(self, output):
        shard = only_shard(output, "validation")
        shard.unlink()
        with pytest.raises(DatasetError, match=rf"{shard.name}: shard listed in the manifest is missing"):
            open_dataset(str(output))
        (output / "manifest.json").unlink()
        with pytest.raises(DatasetError, match=r"manifest.json does not exist"):
            open_dataset(str(output))

    def test_tf_dataset_yields_the_verified_examples(self, output):
        verified = open_dataset(str(output), splits=("eval",))
        images, labels = next(iter(verified.tf_dataset("eval", batch_size=64)))
        assert images.shape == (20, 32, 32, 3) and images.dtype.name == "uint8"
        assert sorted(labels.numpy().tolist()) == sorted(((np.arange(20) + 5) % 10).tolist())
        _ = dataset_module.Manifest.from_json((output / "manifest.json").read_bytes(), "manifest")
        assert read_manifest(str(output))[0].num_classes == 10


def test_clean_up_never_removes_shards_another_run_is_about_to_publish(tmp_path, monkeypatch):
    """Run B starts right after run A published its manifest and writes its shards while A cleans up: A must leave
    B's shards alone, so B's manifest (which rightly replaces A's) verifies. Both runs succeed."""
    import threading

    first_archive = builders.write_python_archive(tmp_path / "a.tar.gz", builders.official_data(per_batch=20))
    second_archive = builders.write_python_archive(tmp_path / "b.tar.gz", builders.official_data(per_batch=20, seed=5))
    output = tmp_path / "out"
    prepare(tmp_path, first_archive, examples_per_shard=10)  # an earlier dataset, replaced by run A below
    b_wrote_its_shards, a_cleaned_up = threading.Event(), threading.Event()
    original_publish = stores.LocalPublisher.publish
    outcomes, threads = {}, []

    def run(name, archive, per_shard):
        config = PrepareDataConfig(output=str(output), source=str(archive), examples_per_shard=per_shard, force=True)
        outcomes[name] = prepare_data(config)
        if name == "a":
            a_cleaned_up.set()

    def publish(self, name, data, expected_version=None):
        if name == "manifest.json" and threading.current_thread().name == "run-b":
            b_wrote_its_shards.set()
            a_cleaned_up.wait(timeout=60)  # B publishes its manifest only after A's clean-up ran
        version = original_publish(self, name, data, expected_version)
        if name == "manifest.json" and threading.current_thread().name == "run-a":
            threads.append(threading.Thread(target=run, args=("b", second_archive, 20), name="run-b"))
            threads[-1].start()  # B starts from A's published manifest
            b_wrote_its_shards.wait(timeout=60)  # A cleans up while B's shards are written but not yet published
        return version

    monkeypatch.setattr(stores.LocalPublisher, "publish", publish)
    run_a = threading.Thread(target=run, args=("a", first_archive, 40), name="run-a")
    run_a.start()
    run_a.join(timeout=120)
    threads[0].join(timeout=120)

    assert set(outcomes) == {"a", "b"}, "both runs succeed"
    verified = open_dataset(str(output))  # every shard the published manifest names is there and intact
    assert verified.manifest_sha256 == outcomes["b"].manifest_sha256


def test_what_a_killed_run_left_half_written_is_removed_by_the_next(tmp_path):
    import subprocess

    archive = builders.write_python_archive(tmp_path / "cifar.tar.gz", builders.official_data(per_batch=10))
    output = tmp_path / "out"
    prepare_data(PrepareDataConfig(output=str(output), source=str(archive)))
    finished = subprocess.Popen(["true"])
    finished.wait()  # a process that has ended: what a kill -9 leaves behind
    shard = next(output.glob("train/*.tfrecord"))
    left = filesystem.temporary_path(shard).name.replace(f".{os.getpid()}.", f".{finished.pid}.")
    (shard.parent / left).write_bytes(b"half a shard")
    live = filesystem.temporary_path(shard)  # a writer that is still at work
    live.write_bytes(b"being written")
    prepare_data(PrepareDataConfig(output=str(output), source=str(archive), force=True))
    assert not (shard.parent / left).exists()
    assert live.exists()


def test_images_of_several_sizes_are_resized_when_asked_and_the_model_input_is_that_size(tmp_path):
    """As Keras's image_dataset_from_directory(image_size=...): every image resized, bilinear and antialiased."""
    from components.common.pixels import resize_images

    builders.write_class_folders(tmp_path / "images", {"train": 3, "test": 1})
    large = np.random.default_rng(1).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    (tmp_path / "images" / "train" / "cat" / "large.png").write_bytes(builders.encode_png(large))
    result = prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=str(tmp_path / "images"),
                                            resize="24x20"))  # fmt: skip
    assert result.manifest.image_shape == [24, 20, 3] and result.manifest.parameters["resize"] == [24, 20]
    verified = open_dataset(str(tmp_path / "out"))
    stored = builders.read_records([path for files in verified.files.values() for path in files])
    (pixels, _label) = next(value for name, value in stored.items() if name.endswith("train/cat/large.png"))
    np.testing.assert_array_equal(pixels, resize_images(large[None], 24, 20).numpy()[0])
    from components.train import loop

    loop.train(builders.tiny_train_config(str(tmp_path / "out"), tmp_path / "model", train_steps=2))
    resolved = json.loads((tmp_path / "model" / "config.json").read_text())["resolved"]
    assert resolved["image_shape"] == [24, 20, 3] and resolved["resize_images"] is True  # served images resized too


def test_images_of_one_size_other_than_32_need_no_resizing(tmp_path):
    builders.write_class_folders(tmp_path / "images", {"train": 2, "test": 1}, size=40)
    result = prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=str(tmp_path / "images")))
    assert result.manifest.image_shape == [40, 40, 3]
