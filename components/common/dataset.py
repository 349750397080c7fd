"""The dataset manifest, and opening a prepared dataset after verifying it against its manifest.

A prepared dataset is a folder (local, gs:// or s3://) holding `manifest.json` and, per split, shards named
`<split>/<split>-<index>-of-<count>.tfrecord[.gz]`. The manifest is written last; `open_dataset`
checks every shard's size, SHA-256 and record count before any stage reads a single example, so
training never starts on truncated or tampered data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.common import records, storage

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "validation", "eval")


class DatasetError(ValueError):
    """A prepared dataset is missing, incomplete, or does not match its manifest."""


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset root
    num_records: int
    size_bytes: int
    sha256: str
    crc32c: str  # base64, as Cloud Storage reports it


@dataclass(frozen=True)
class SplitInfo:
    num_examples: int
    class_counts: list[int]
    shards: list[ShardInfo]


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    dataset: str  # "cifar10", "images" (class folders) or "synthetic"
    synthetic: bool
    source: dict[str, Any]  # uri, format, sha256
    label_names: list[str]
    image_shape: list[int]  # [height, width, channels]
    compression: str
    parameters: dict[str, Any]
    splits: dict[str, SplitInfo]
    record_schema: dict[str, str] = field(
        default_factory=lambda: {
            records.FEATURE_IMAGE: "bytes: raw uint8 pixels, HWC, RGB",
            records.FEATURE_LABEL: "int64: index into label_names",
            records.FEATURE_HEIGHT: "int64",
            records.FEATURE_WIDTH: "int64",
            records.FEATURE_CHANNELS: "int64",
            records.FEATURE_ID: "bytes: stable example id, UTF-8",
        }
    )

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, content: bytes, origin: str) -> Manifest:
        try:
            raw = json.loads(content)
            splits = {
                name: SplitInfo(
                    num_examples=int(split["num_examples"]),
                    class_counts=[int(count) for count in split["class_counts"]],
                    shards=[ShardInfo(**shard) for shard in split["shards"]],
                )
                for name, split in raw.pop("splits").items()
            }
            manifest = cls(splits=splits, **raw)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise DatasetError(f"{origin}: not a valid dataset manifest: {error}") from error
        if manifest.schema_version != records.SCHEMA_VERSION:
            raise DatasetError(
                f"{origin}: schema_version {manifest.schema_version} is not supported "
                f"(this code reads version {records.SCHEMA_VERSION})"
            )
        return manifest

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise DatasetError(f"split {name!r} is not in the dataset; it has {sorted(self.splits)}")
        return self.splits[name]


def manifest_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def read_manifest(dataset_uri: str) -> tuple[Manifest, str]:
    """The manifest of a prepared dataset and the SHA-256 of its bytes."""
    uri = storage.join(dataset_uri, MANIFEST_NAME)
    try:
        content = storage.read_bytes(uri)
    except FileNotFoundError as error:
        raise DatasetError(
            f"{uri} does not exist: {dataset_uri} is not a prepared dataset, or its preparation did not finish"
        ) from error
    return Manifest.from_json(content, uri), manifest_digest(content)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "cifar10-pipeline")


def verify_shard(content: bytes, shard: ShardInfo, compression: str, origin: str, num_classes: int) -> np.ndarray:
    """Check one shard's bytes against its manifest entry (size, SHA-256, record count, every label a class);
    return how many records each class has."""
    if len(content) != shard.size_bytes:
        raise DatasetError(f"{origin}: has {len(content)} bytes, manifest says {shard.size_bytes} (truncated?)")
    digest = hashlib.sha256(content).hexdigest()
    if digest != shard.sha256:
        raise DatasetError(f"{origin}: SHA-256 {digest} does not match the manifest's {shard.sha256}")
    try:
        labels = [records.example_label(record) for record in records.iterate_records(content, compression, origin)]
    except ValueError as error:
        raise DatasetError(f"{origin}: {error}") from error
    if len(labels) != shard.num_records:
        raise DatasetError(f"{origin}: holds {len(labels)} records, manifest says {shard.num_records}")
    outside = sorted({label for label in labels if not 0 <= label < num_classes})
    if outside:
        raise DatasetError(f"{origin}: labels {outside[:5]} are not classes of this dataset (0..{num_classes - 1})")
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)


@dataclass(frozen=True)
class VerifiedDataset:
    """A dataset whose shards were checked; `files` are local paths TensorFlow can read."""

    uri: str
    manifest: Manifest
    manifest_sha256: str
    files: dict[str, list[str]]

    def tf_dataset(self, split: str, batch_size: int | None = None):
        """A `tf.data.Dataset` of (uint8 image [H, W, C], int64 label), batched when `batch_size` is given."""
        import tensorflow as tf

        compression = "" if self.manifest.compression == records.COMPRESSION_NONE else self.manifest.compression
        shape = self.manifest.image_shape
        dataset = tf.data.TFRecordDataset(self.files[split], compression_type=compression)
        dataset = dataset.batch(batch_size or 1024).map(
            lambda serialized: records.parse_batch(serialized, shape), num_parallel_calls=tf.data.AUTOTUNE
        )
        return dataset if batch_size else dataset.unbatch()


def open_dataset(
    dataset_uri: str, splits: tuple[str, ...] | None = None, cache_dir: str | Path | None = None
) -> VerifiedDataset:
    """Verify a prepared dataset against its manifest and return local paths to its shards.

    Local datasets are read in place; gs:// and s3:// shards are downloaded to `cache_dir` (default
    `$XDG_CACHE_HOME/cifar10-pipeline`, keyed by their SHA-256 so a verified copy is reused).
    Raises DatasetError naming the shard and the mismatch.
    """
    manifest, digest = read_manifest(dataset_uri)
    wanted = splits or tuple(manifest.splits)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if storage.is_remote(dataset_uri):
        storage.remove_stale_temporaries(cache / "shards")
    files: dict[str, list[str]] = {}
    for split_name in wanted:
        split = manifest.split(split_name)
        if sum(shard.num_records for shard in split.shards) != split.num_examples:
            raise DatasetError(f"{dataset_uri}: split {split_name!r} shard record counts do not add up")
        if len(split.class_counts) != manifest.num_classes:
            raise DatasetError(
                f"{dataset_uri}: split {split_name!r} has {len(split.class_counts)} class counts for "
                f"{manifest.num_classes} classes"
            )
        counts = np.zeros(manifest.num_classes, dtype=np.int64)
        files[split_name] = []
        for shard in split.shards:
            path, shard_counts = _verified_local_copy(dataset_uri, shard, manifest, cache)
            files[split_name].append(path)
            counts += shard_counts
        if counts.tolist() != list(split.class_counts):
            differing = [
                f"{manifest.label_names[index]} {counted} (manifest {listed})"
                for index, (counted, listed) in enumerate(zip(counts.tolist(), split.class_counts, strict=True))
                if counted != listed
            ]
            raise DatasetError(
                f"{dataset_uri}: split {split_name!r} holds other per-class counts than its manifest says: "
                + ", ".join(differing[:5])
            )
    logger.info(
        "verified dataset %s (%s): %s",
        dataset_uri,
        manifest.dataset,
        ", ".join(f"{name} {manifest.splits[name].num_examples} examples" for name in wanted),
    )
    return VerifiedDataset(uri=dataset_uri, manifest=manifest, manifest_sha256=digest, files=files)


def _verified_local_copy(dataset_uri: str, shard: ShardInfo, manifest: Manifest, cache: Path) -> tuple[str, np.ndarray]:
    """A local path of the verified shard (the shard itself, or a cached copy of a remote one), and its counts."""
    uri = storage.join(dataset_uri, shard.path)
    compression, num_classes = manifest.compression, manifest.num_classes
    if not storage.is_remote(dataset_uri):
        try:
            content = Path(uri).read_bytes()
        except FileNotFoundError as error:
            raise DatasetError(f"{uri}: shard listed in the manifest is missing") from error
        return uri, verify_shard(content, shard, compression, uri, num_classes)
    local = cache / "shards" / f"{shard.sha256}{''.join(Path(shard.path).suffixes)}"
    if local.exists():
        origin = f"{local} (cached copy of {uri})"
        return str(local), verify_shard(local.read_bytes(), shard, compression, origin, num_classes)
    try:
        content = storage.read_bytes(uri)
    except FileNotFoundError as error:
        raise DatasetError(f"{uri}: shard listed in the manifest is missing") from error
    counts = verify_shard(content, shard, compression, uri, num_classes)
    storage.atomic_write_bytes(local, content)
    return str(local), counts
