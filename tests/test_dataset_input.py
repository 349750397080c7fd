"""A prepared dataset is input too: train and evaluate read a manifest and shards someone else may have written.
Reads are bounded by the manifest's own sizes, only regular files inside the dataset folder are read, and every
manifest field is typed and range-checked; each problem is one line naming the file and field."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from components.common import filesystem
from components.common.dataset import DatasetError, open_dataset
from tests.builders import REPOSITORY, tiny_train_config


@pytest.fixture
def dataset(synthetic_data, tmp_path):
    """A copy of the session's prepared dataset, to tamper with."""
    copy = tmp_path / "dataset"
    shutil.copytree(synthetic_data, copy)
    return copy


def manifest_of(dataset) -> dict:
    return json.loads((dataset / "manifest.json").read_text())


def rewrite(dataset, change) -> None:
    manifest = manifest_of(dataset)
    change(manifest)
    (dataset / "manifest.json").write_text(json.dumps(manifest))


def train_shard(dataset):
    return dataset / manifest_of(dataset)["splits"]["train"]["shards"][0]["path"]


def refused(dataset, match, splits=("train",)) -> str:
    started = time.monotonic()
    with pytest.raises(DatasetError, match=match) as error:
        open_dataset(str(dataset), splits=splits)
    assert time.monotonic() - started < 20
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_shard_that_is_a_fifo_is_refused_without_blocking(dataset):
    shard = train_shard(dataset)
    shard.unlink()
    os.mkfifo(shard)  # nobody ever writes it: reading it would block for ever
    refused(dataset, rf"{shard}: not a regular file \(a FIFO\)")


def test_a_shard_linked_to_an_endless_device_is_never_read(dataset):
    shard = train_shard(dataset)
    shard.unlink()
    shard.symlink_to("/dev/zero")
    refused(dataset, rf"{shard}: leads outside the dataset folder .* \(to /dev/zero\)")


def test_a_shard_larger_than_its_manifest_says_is_not_read_past_that_size(dataset):
    shard = train_shard(dataset)
    with open(shard, "ab") as handle:
        handle.write(bytes(10 << 20))
    refused(dataset, rf"{shard.name}: has 1[\d,]+ bytes, manifest says [\d,]+$")


@pytest.mark.parametrize("path", ["../outside.tfrecord", "/etc/passwd", "train/../../outside.tfrecord", "train//x"])
def test_shard_paths_stay_inside_the_dataset(dataset, path):
    rewrite(dataset, lambda manifest: manifest["splits"]["train"]["shards"][0].update(path=path))
    refused(dataset, r"manifest\.json: not a valid dataset manifest: splits\.train\.shards\[0\]\.path: .*leaves the "
                     r"dataset folder")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m["splits"]["train"]["shards"][0].update(num_records="16"),
         r"splits\.train\.shards\[0\]\.num_records: expected a number, got \"16\""),
        (lambda m: m["splits"]["train"]["shards"][0].update(size_bytes=-1),
         r"splits\.train\.shards\[0\]\.size_bytes: -1 is not in \[0, "),
        (lambda m: m["splits"]["train"]["shards"][0].update(num_records=True),
         r"splits\.train\.shards\[0\]\.num_records: expected a number, got true"),
        (lambda m: m["splits"]["train"].update(num_examples=1.5), r"splits\.train\.num_examples: expected a number"),
        (lambda m: m.update(image_shape=[32, 32]), r"image_shape: expected \[height, width, channels\]"),
        (lambda m: m.update(image_shape=[32, "32", 3]), r"image_shape\[1\]: expected a number, got \"32\""),
        (lambda m: m.update(image_shape=[0, 32, 3]), r"image_shape\[0\]: 0 is not in \[1, "),
        (lambda m: m.update(compression="ZSTD"), r"compression: 'ZSTD' is not one of NONE, GZIP"),
        (lambda m: m.update(schema_version="1"), r"schema_version: expected a number"),
        (lambda m: m.update(label_names="airplane"), r"label_names: expected list"),
        (lambda m: m["label_names"].__setitem__(1, m["label_names"][0]), r"label_names: classes 0 and 1 .* the same"),
        (lambda m: m["splits"].update(test=m["splits"]["train"]), r"splits\.test: not a split"),
        (lambda m: m["splits"]["train"]["shards"][0].update(sha256="XYZ"),
         r"splits\.train\.shards\[0\]\.sha256: 'XYZ' is not 64 lowercase hex"),
        (lambda m: m["splits"]["train"]["shards"][0].update(extra=1),
         r"splits\.train\.shards\[0\]\.extra: not a shard field"),
        (lambda m: m.update(splits=[]), r"splits: expected dict"),
        (lambda m: m["splits"]["train"]["class_counts"].__setitem__(0, -1),
         r"splits\.train\.class_counts\[0\]: -1 is not in"),
    ],
    ids=["count as text", "negative size", "count as bool", "float count", "short shape", "shape as text",
         "zero side", "compression", "version as text", "names not a list", "duplicate names", "unknown split",
         "digest", "unknown shard field", "splits not an object", "negative class count"],
)  # fmt: skip
def test_every_manifest_field_is_typed_and_range_checked(dataset, change, match):
    rewrite(dataset, change)
    refused(dataset, rf"manifest\.json: not a valid dataset manifest: {match}")


def test_a_shard_listed_twice_is_refused(dataset):
    def duplicate(manifest):
        split = manifest["splits"]["train"]
        split["shards"].append(dict(split["shards"][0]))
        split["num_examples"] *= 2
        split["class_counts"] = [count * 2 for count in split["class_counts"]]

    rewrite(dataset, duplicate)
    refused(dataset, r"splits\.train\.shards\[1\]\.path: the same shard as splits\.train\.shards\[0\] \(listed twice\)")


def test_an_image_shape_other_than_the_records_hold_is_refused(dataset):
    rewrite(dataset, lambda manifest: manifest.update(image_shape=[64, 64, 3]))
    refused(dataset, r"record 0: its image is 3,072 bytes, but the manifest's image_shape \[64, 64, 3\] needs 12,288")


def _replace_train_shard(dataset, content: bytes, num_records: int | None = None, compression: str | None = None):
    shard = train_shard(dataset)
    shard.write_bytes(content)

    def change(manifest):
        entry = manifest["splits"]["train"]["shards"][0]
        entry.update(size_bytes=len(content), sha256=hashlib.sha256(content).hexdigest(),
                     crc32c=filesystem.crc32c_base64(content))  # fmt: skip
        if compression:
            manifest["compression"] = compression

    rewrite(dataset, change)


def test_a_gzip_shard_that_unpacks_past_its_records_is_refused_without_unpacking_it(dataset):
    _replace_train_shard(dataset, gzip.compress(bytes(1 << 30), compresslevel=1), compression="GZIP")
    refused(dataset, r"decompresses to more than [\d,]+ bytes \(for \d+ records\)")


def test_many_tiny_gzip_members_are_verified_in_linear_time(dataset):
    original = train_shard(dataset).read_bytes()
    members = b"".join(gzip.compress(original[index : index + 1], mtime=0) for index in range(len(original)))
    _replace_train_shard(dataset, members, compression="GZIP")
    started = time.process_time()
    verified = open_dataset(str(dataset), splits=("train",))
    assert time.process_time() - started < 10
    assert verified.manifest.splits["train"].num_examples > 0


def test_a_bad_dataset_is_one_line_and_exit_2_from_train_and_evaluate(dataset, tmp_path):
    shard = train_shard(dataset)
    shard.unlink()
    os.mkfifo(shard)
    config = tiny_train_config(str(dataset), tmp_path / "model", train_steps=2)
    from components.common.config import config_to_dict

    completed = subprocess.run(
        [sys.executable, "-m", "components.train", "--config", json.dumps(config_to_dict(config))],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert len(errors) == 1 and "not a regular file (a FIFO)" in errors[0] and "Traceback" not in completed.stderr
