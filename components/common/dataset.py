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
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.common import documents, filesystem, records, storage
from components.common.compression import gunzip_bounded

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
STATISTICS_NAME = (
    "statistics.json"  # beside the manifest, which holds its SHA-256 (components/prepare_data/statistics.py)
)
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
    statistics: dict[str, str] | None = None  # {"path": "statistics.json", "sha256": ...}; None: prepared before them

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, content: bytes, origin: str) -> Manifest:
        """The manifest in `content`, every field checked for type and range (a prepared dataset is input too):
        DatasetError naming the field otherwise."""
        try:
            raw = documents.load(content, origin, "dataset manifest", yaml_allowed=False)
        except documents.DocumentError as error:
            raise DatasetError(f"not a valid dataset manifest: {error}") from None
        return _checked_manifest(cls, raw, _Fields(origin))

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise DatasetError(f"split {name!r} is not in the dataset; it has {sorted(self.splits)}")
        return self.splits[name]


def manifest_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def read_manifest(dataset_uri: str) -> tuple[Manifest, str]:
    """The manifest of a prepared dataset and the SHA-256 of its bytes."""
    uri = filesystem.join(dataset_uri, MANIFEST_NAME)
    try:
        content = _read_bounded(uri, MAX_MANIFEST_BYTES)
    except FileNotFoundError as error:
        raise DatasetError(
            f"{uri} does not exist: {dataset_uri} is not a prepared dataset, or its preparation did not finish"
        ) from error
    return Manifest.from_json(content, uri), manifest_digest(content)


def _read_bounded(uri: str, max_bytes: int, expected_size: int | None = None) -> bytes:
    """A local regular file or a remote object of at most `max_bytes` (exactly `expected_size` when given), its size
    checked before it is read: DatasetError naming it otherwise; FileNotFoundError when it is absent."""
    try:
        content = storage.read_bounded(uri, max_bytes if expected_size is None else expected_size)
    except filesystem.FileReadError as error:
        if error.size is not None:
            _check_size(uri, error.size, max_bytes, expected_size)
        raise DatasetError(str(error)) from error
    _check_size(uri, len(content), max_bytes, expected_size)
    return content


def _check_size(uri: str, size: int, max_bytes: int, expected_size: int | None) -> None:
    if expected_size is not None and size != expected_size:
        hint = " (truncated?)" if size < expected_size else ""
        raise DatasetError(f"{uri}: has {size:,} bytes, manifest says {expected_size:,}{hint}")
    if size > max_bytes:
        raise DatasetError(f"{uri}: {size:,} bytes, more than the {max_bytes:,} it may have")


MAX_MANIFEST_BYTES = 64 << 20
MAX_SHARD_BYTES = 16 << 30
MAX_IMAGE_SIDE = 4096
MAX_RECORD_OVERHEAD = 4096  # framing, feature keys, the id: bytes a record may hold beyond its image
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CRC32C = re.compile(r"[A-Za-z0-9+/]{6}==")


class _Fields:
    """Reads typed fields of a parsed manifest, naming the one that is wrong: `manifest.json: splits.train...`."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, problem: str) -> DatasetError:
        return DatasetError(f"{self.origin}: not a valid dataset manifest: {where}: {problem}")

    def get(self, mapping: dict, key: str, where: str, kinds: type | tuple[type, ...]):
        if key not in mapping:
            raise self.fail(f"{where}{key}", "missing")
        value = mapping[key]
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join("a number" if kind is int else kind.__name__ for kind in kinds)
            raise self.fail(f"{where}{key}", f"expected {names}, got {json.dumps(value)[:80]}")
        return value

    def integer(self, mapping: dict, key: str, where: str, low: int, high: int) -> int:
        value = self.get(mapping, key, where, int)
        if not low <= value <= high:
            raise self.fail(f"{where}{key}", f"{value} is not in [{low:,}, {high:,}]")
        return value


def _checked_manifest(cls, raw, fields: _Fields) -> Manifest:
    if not isinstance(raw, dict):
        raise fields.fail("the top level", f"expected an object, got {type(raw).__name__}")
    version = fields.get(raw, "schema_version", "", int)
    if version != records.SCHEMA_VERSION:
        raise DatasetError(
            f"{fields.origin}: schema_version {version} is not supported (this code reads version "
            f"{records.SCHEMA_VERSION})"
        )
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise fields.fail(unknown[0], f"not a manifest field (the fields are {', '.join(sorted(known))})")
    label_names = fields.get(raw, "label_names", "", list)
    check_label_names(label_names, lambda problem: fields.fail("label_names", problem))
    image_shape = fields.get(raw, "image_shape", "", list)
    if len(image_shape) != 3:
        raise fields.fail("image_shape", f"expected [height, width, channels], got {image_shape}")
    shape = {"image_shape[0]": image_shape[0], "image_shape[1]": image_shape[1], "image_shape[2]": image_shape[2]}
    for name in ("image_shape[0]", "image_shape[1]"):
        fields.integer(shape, name, "", 1, MAX_IMAGE_SIDE)
    fields.integer(shape, "image_shape[2]", "", 3, 3)  # RGB, as the record schema says
    compression = fields.get(raw, "compression", "", str)
    if compression not in (records.COMPRESSION_NONE, records.COMPRESSION_GZIP):
        raise fields.fail(
            "compression", f"{compression!r} is not one of {records.COMPRESSION_NONE}, {records.COMPRESSION_GZIP}"
        )
    record_schema = fields.get(raw, "record_schema", "", dict) if "record_schema" in raw else None
    raw_splits = fields.get(raw, "splits", "", dict)
    if not raw_splits:
        raise fields.fail("splits", "no split")
    splits, seen_paths, seen_digests = {}, {}, {}
    for split_name, raw_split in raw_splits.items():
        where = f"splits.{split_name}."
        if split_name not in SPLITS:
            raise fields.fail(f"splits.{split_name}", f"not a split (the splits are {', '.join(SPLITS)})")
        if not isinstance(raw_split, dict):
            raise fields.fail(f"splits.{split_name}", "expected an object")
        num_examples = fields.integer(raw_split, "num_examples", where, 0, 10**9)
        class_counts = fields.get(raw_split, "class_counts", where, list)
        if len(class_counts) != len(label_names):
            raise fields.fail(f"{where}class_counts", f"{len(class_counts)} counts for {len(label_names)} classes")
        counts = {f"class_counts[{index}]": count for index, count in enumerate(class_counts)}
        for key in counts:
            fields.integer(counts, key, where, 0, num_examples)
        if sum(class_counts) != num_examples:
            raise fields.fail(f"{where}class_counts", f"add up to {sum(class_counts)}, not num_examples {num_examples}")
        shards = []
        for index, raw_shard in enumerate(fields.get(raw_split, "shards", where, list)):
            shard_where = f"{where}shards[{index}]."
            if not isinstance(raw_shard, dict):
                raise fields.fail(f"{where}shards[{index}]", "expected an object")
            extra = sorted(set(raw_shard) - {field.name for field in dataclasses.fields(ShardInfo)})
            if extra:
                raise fields.fail(f"{shard_where}{extra[0]}", "not a shard field")
            path = check_shard_path(fields.get(raw_shard, "path", shard_where, str), fields, f"{shard_where}path")
            size_bytes = fields.integer(raw_shard, "size_bytes", shard_where, 0, MAX_SHARD_BYTES)
            num_records = fields.integer(raw_shard, "num_records", shard_where, 0, 10**9)
            sha256 = fields.get(raw_shard, "sha256", shard_where, str)
            if not _SHA256.fullmatch(sha256):
                raise fields.fail(f"{shard_where}sha256", f"{sha256[:80]!r} is not 64 lowercase hex digits")
            crc32c = fields.get(raw_shard, "crc32c", shard_where, str)
            if not _CRC32C.fullmatch(crc32c):
                raise fields.fail(f"{shard_where}crc32c", f"{crc32c[:80]!r} is not a base64 CRC32C")
            for seen, key, value in ((seen_paths, "path", path), (seen_digests, "sha256", sha256)):
                if value in seen:
                    raise fields.fail(f"{shard_where}{key}", f"the same shard as {seen[value]} (listed twice)")
                seen[value] = f"{where}shards[{index}]"
            shards.append(ShardInfo(path, num_records, size_bytes, sha256, crc32c))
        if sum(shard.num_records for shard in shards) != num_examples:
            raise fields.fail(
                f"{where}shards", f"hold {sum(s.num_records for s in shards)} records, not {num_examples}"
            )
        splits[split_name] = SplitInfo(num_examples, list(class_counts), shards)
    optional = {"record_schema": record_schema} if record_schema is not None else {}
    if raw.get("statistics") is not None:
        optional["statistics"] = _checked_statistics_entry(fields.get(raw, "statistics", "", dict), fields)
    return cls(
        schema_version=version,
        dataset=fields.get(raw, "dataset", "", str),
        synthetic=fields.get(raw, "synthetic", "", bool),
        source=fields.get(raw, "source", "", dict),
        label_names=list(label_names),
        image_shape=list(image_shape),
        compression=compression,
        parameters=fields.get(raw, "parameters", "", dict),
        splits=splits,
        **optional,
    )


def _checked_statistics_entry(entry: dict, fields: _Fields) -> dict[str, str]:
    if set(entry) != {"path", "sha256"}:
        raise fields.fail("statistics", f"expected {{path, sha256}}, got fields {sorted(entry)[:5]}")
    if entry["path"] != STATISTICS_NAME:
        raise fields.fail("statistics.path", f"{str(entry['path'])[:80]!r} is not {STATISTICS_NAME}")
    if not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"]):
        raise fields.fail("statistics.sha256", f"{str(entry['sha256'])[:80]!r} is not 64 lowercase hex digits")
    return dict(entry)


def check_label_names(names: list, fail) -> None:
    """Class names are non-empty strings without control characters, distinct even after Unicode normalisation
    (NFKC: "café" composed and decomposed are one name); `fail(problem)` makes the error to raise."""
    if not names:
        raise fail("no class names")
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            raise fail(f"class {index} has no name ({json.dumps(name)[:80]})")
        if any(unicodedata.category(character) == "Cc" for character in name):
            raise fail(f"class {index} name {name!r} holds control characters")
        normalized = unicodedata.normalize("NFKC", name)
        if normalized in seen:
            same = "the same name" if names[seen[normalized]] == name else "equal after Unicode normalisation"
            raise fail(f"classes {seen[normalized]} and {index} ({names[seen[normalized]]!r}, {name!r}) are {same}")
        seen[normalized] = index


def check_shard_path(path: str, fields: _Fields, where: str) -> str:
    """A shard's path stays inside the dataset: relative, with no `..`, `.` or empty parts, no backslash or
    control character."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or "\\" in path
        or any(unicodedata.category(character) == "Cc" for character in path)
    ):
        raise fields.fail(where, f"{path[:120]!r} leaves the dataset folder or is not a plain relative path")
    return path


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "cifar10-pipeline")


def verify_shard(content: bytes, shard: ShardInfo, manifest: Manifest, origin: str) -> np.ndarray:
    """Check one shard's bytes against its manifest entry (size, SHA-256, record count, every record an image of the
    manifest's shape with a label that is a class); return how many records each class has."""
    if len(content) != shard.size_bytes:
        raise DatasetError(f"{origin}: has {len(content)} bytes, manifest says {shard.size_bytes} (truncated?)")
    digest = hashlib.sha256(content).hexdigest()
    if digest != shard.sha256:
        raise DatasetError(f"{origin}: SHA-256 {digest} does not match the manifest's {shard.sha256}")
    checker = records.RecordChecker(manifest.image_shape)
    if manifest.compression == records.COMPRESSION_GZIP:
        bound = shard.num_records * (int(np.prod(manifest.image_shape)) + MAX_RECORD_OVERHEAD)
        try:
            content = gunzip_bounded(content, bound)
        except ValueError as error:
            raise DatasetError(f"{origin}: {error} (for {shard.num_records} records)") from error
    labels = []
    try:
        for index, record in enumerate(records.iterate_records(content, records.COMPRESSION_NONE, origin)):
            try:
                labels.append(checker.label(record))
            except ValueError as error:
                raise DatasetError(f"{origin}: record {index}: {error}") from error
    except DatasetError:
        raise
    except ValueError as error:  # the framing: names the file and the record itself
        raise DatasetError(str(error)) from error
    if len(labels) != shard.num_records:
        raise DatasetError(f"{origin}: holds {len(labels)} records, manifest says {shard.num_records}")
    num_classes = manifest.num_classes
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

    def joined(self, name: str, splits: tuple[str, ...]) -> VerifiedDataset:
        """This dataset with split `name` read from the files of all of `splits` (the train stage's train_on)."""
        return dataclasses.replace(self, files={**self.files, name: [f for split in splits for f in self.files[split]]})

    def tf_dataset(self, split: str, batch_size: int | None = None, with_ids: bool = False):
        """A `tf.data.Dataset` of (uint8 image [H, W, C], int64 label) (and the string id, `with_ids`), batched when
        `batch_size` is given."""
        import tensorflow as tf

        compression = "" if self.manifest.compression == records.COMPRESSION_NONE else self.manifest.compression
        shape = self.manifest.image_shape
        dataset = tf.data.TFRecordDataset(self.files[split], compression_type=compression)
        dataset = dataset.batch(batch_size or 1024).map(
            lambda serialized: records.parse_batch(serialized, shape, with_ids), num_parallel_calls=tf.data.AUTOTUNE
        )
        return (dataset if batch_size else dataset.unbatch()).with_options(_reader_options())


def _reader_options():
    """Reading on one thread of its own. Its callers score a model on the batches as they come (predict, training's
    validation), and tf.data's shared threads, autotuned, made the model's calls run on one core in a third to a
    half of the runs on a 2-core machine (20,000 images scored in 5.1 s against 2.6; bench/predict.py): reading is
    a small part of the work, and the model needs the cores."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return options


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
    if filesystem.is_remote(dataset_uri):
        filesystem.remove_stale_temporaries(cache / "shards")
    files: dict[str, list[str]] = {}
    for split_name in wanted:
        split = manifest.split(split_name)
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
    uri = filesystem.join(dataset_uri, shard.path)
    if not filesystem.is_remote(dataset_uri):
        root = os.path.realpath(dataset_uri)
        resolved = os.path.realpath(uri)
        if not resolved.startswith(root + os.sep):
            raise DatasetError(f"{uri}: leads outside the dataset folder {dataset_uri} (to {resolved})")
        return uri, verify_shard(_read_shard(uri, shard), shard, manifest, uri)
    local = cache / "shards" / f"{shard.sha256}{''.join(Path(shard.path).suffixes)}"
    if local.exists():
        origin = f"{local} (cached copy of {uri})"
        return str(local), verify_shard(_read_shard(str(local), shard), shard, manifest, origin)
    content = _read_shard(uri, shard)
    counts = verify_shard(content, shard, manifest, uri)
    filesystem.atomic_write_bytes(local, content)
    return str(local), counts


def _read_shard(uri: str, shard: ShardInfo) -> bytes:
    try:
        return _read_bounded(uri, MAX_SHARD_BYTES, expected_size=shard.size_bytes)
    except FileNotFoundError as error:
        raise DatasetError(f"{uri}: shard listed in the manifest is missing") from error
