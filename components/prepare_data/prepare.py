"""The prepare_data stage: source -> validated splits -> sharded, checksummed TFRecords + manifest.

Order of work, so that bad input publishes nothing and a reader never sees partial data:
1. resolve the source (download/cache, SHA-256 check) and compare with the published manifest: when the
   source digest and the output parameters match and every shard is intact, nothing is rewritten;
2. read and validate everything in memory (any SourceError stops here, before any write);
3. publish each shard atomically under a name keyed by (schema, source digest, parameters), so writers of
   different data never touch each other's shards and the previous dataset stays readable meanwhile;
4. replace the manifest last, as a compare-and-swap against the version read in step 1; a concurrent
   writer of different data makes this fail loudly instead of mixing datasets;
5. remove shards that no manifest refers to any more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from components.common import file_errors, filesystem, records, storage, stores
from components.common.dataset import (
    MANIFEST_NAME,
    STATISTICS_NAME,
    Manifest,
    ShardInfo,
    SplitInfo,
    default_cache_dir,
    manifest_digest,
)
from components.common.progress import Progress
from components.prepare_data import fetch, splits, synthetic
from components.prepare_data import statistics as data_statistics
from components.prepare_data.config import OFFICIAL_SHA256, OFFICIAL_URL, PrepareDataConfig
from components.prepare_data.safe_io import DirTree, FileTree, SourceError, TarTree, check_source_size
from components.prepare_data.sources import RawDataset, check_classes_present, read_tree, resized_dataset

logger = logging.getLogger(__name__)

PUBLISH_THREADS = 4


@dataclass(frozen=True)
class PrepareResult:
    output: str
    manifest: Manifest
    manifest_sha256: str
    reused: bool


@dataclass(frozen=True)
class ResolvedSource:
    uri: str
    sha256: str
    path: Path | None = None  # None for synthetic data
    folder: DirTree | None = None  # a folder source, already walked (and hashed) for its digest
    max_bytes: int = 0  # the most the source may unpack to

    def tree(self) -> FileTree:
        if self.folder is not None:
            return self.folder
        return TarTree(self.path, self.max_bytes, self.uri)


def resolve_source(config: PrepareDataConfig) -> ResolvedSource:
    """Make the source readable locally and compute its digest; verify it when a SHA-256 is expected."""
    source = config.source
    if source == "synthetic":
        specification = synthetic.specification(
            config.synthetic_classes, config.synthetic_train_per_class, config.synthetic_eval_per_class, config.seed
        )
        return ResolvedSource("synthetic", synthetic.specification_sha256(specification))
    expected = config.source_sha256 or (OFFICIAL_SHA256 if source == OFFICIAL_URL else None)
    cache_dir = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    if fetch.is_url(source):
        path, _digest = fetch.download_url(source, cache_dir, expected, config.max_source_bytes)
    elif filesystem.is_remote(source):
        path, _digest = fetch.download_object(source, cache_dir, expected, config.max_source_bytes)
    else:
        path = Path(source)
        if not path.exists():
            raise SourceError(
                f"{source}: no such file or folder (give a URL, gs:// or s3:// URI, archive, folder or 'synthetic')"
            )
    path = Path(path)
    if path.is_dir():
        if expected is not None:
            raise SourceError(f"{source}: --source-sha256 applies to an archive file, not to a folder")
        folder = DirTree(path, config.max_source_bytes)
        return ResolvedSource(source, folder.sha256(), path, folder=folder, max_bytes=config.max_source_bytes)
    check_source_size(path, config.max_source_bytes)
    with filesystem.open_regular(path) as handle:  # streamed: a source larger than memory is hashed all the same
        digest = filesystem.sha256_stream(handle)
    if expected is not None and digest != expected.lower():
        raise SourceError(f"{source}: SHA-256 is {digest}, expected {expected.lower()}; the file is damaged")
    return ResolvedSource(source, digest, path, max_bytes=config.max_source_bytes)


def read_source(resolved: ResolvedSource, config: PrepareDataConfig) -> RawDataset:
    if resolved.path is None:
        raw = synthetic.generate(
            config.synthetic_classes, config.synthetic_train_per_class, config.synthetic_eval_per_class, config.seed
        )
        raw = resized_dataset(raw, config.image_size) if config.image_size else raw
    else:
        try:
            raw = read_tree(resolved.tree(), config.source_format, config.image_size, config.max_source_bytes)
        except MemoryError as error:  # every read is bounded, but the machine may have less than the bound
            raise SourceError(
                f"{resolved.uri}: ran out of memory reading the source; give the step more memory (in a pipeline: "
                f"prepare_step_memory) or lower --max-source-megabytes (now {config.max_source_megabytes})"
            ) from error
    raw.source.update(uri=resolved.uri, sha256=resolved.sha256)
    return raw


def dataset_key(source_sha256: str, parameters: dict) -> str:
    """12 hex digits naming one dataset's shards: the same inputs give the same names and bytes."""
    described = json.dumps(
        {"schema_version": records.SCHEMA_VERSION, "source_sha256": source_sha256, "parameters": parameters},
        sort_keys=True,
    )
    return hashlib.sha256(described.encode()).hexdigest()[:12]


def shard_name(split: str, key: str, index: int, count: int, compression: str) -> str:
    suffix = ".gz" if compression == records.COMPRESSION_GZIP else ""
    return f"{split}/{split}-{key}-{index:05d}-of-{count:05d}.tfrecord{suffix}"


def shard_slices(num_examples: int, examples_per_shard: int) -> list[slice]:
    count = max(1, math.ceil(num_examples / examples_per_shard))
    return [
        slice(index * examples_per_shard, min((index + 1) * examples_per_shard, num_examples)) for index in range(count)
    ]


def _publish_shard(publisher: stores.Publisher, name: str, content: bytes, num_records: int) -> ShardInfo:
    """Checksum and publish one shard (on a worker thread: hashing and I/O release the GIL)."""
    info = ShardInfo(
        path=name,
        num_records=num_records,
        size_bytes=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
        crc32c=filesystem.crc32c_base64(content),
    )
    publisher.publish(name, content)
    return info


def _matches(existing: Manifest | None, source_sha256: str, parameters: dict) -> bool:
    return (
        existing is not None
        and existing.schema_version == records.SCHEMA_VERSION
        and existing.source.get("sha256") == source_sha256
        and existing.parameters == parameters
        and existing.statistics is not None  # prepared before statistics were: prepared again, to have them
    )


def _damaged_shards(publisher: stores.Publisher, manifest: Manifest) -> list[str]:
    """Names of the manifest's shards (and statistics) that are missing or differ from it (shards by size and
    CRC32C, the statistics by SHA-256)."""
    damaged = [
        shard.path
        for split in manifest.splits.values()
        for shard in split.shards
        if publisher.checksum(shard.path) != (shard.size_bytes, shard.crc32c)
    ]
    statistics, _version = publisher.read_versioned(STATISTICS_NAME)
    if statistics is None or hashlib.sha256(statistics).hexdigest() != manifest.statistics["sha256"]:
        damaged.append(STATISTICS_NAME)
    return damaged


def _published_manifest(publisher: stores.Publisher) -> tuple[Manifest | None, bytes | None, str]:
    """The published manifest (None when absent or unreadable), its bytes, and its version."""
    content, version = publisher.read_document(MANIFEST_NAME)
    if content is None:
        return None, None, version
    try:
        return Manifest.from_json(content, publisher.uri(MANIFEST_NAME)), content, version
    except ValueError as error:
        logger.warning("the published manifest will be replaced: %s", error)
        return None, content, version


def prepare_data(config: PrepareDataConfig) -> PrepareResult:
    filesystem.apply_single_writer_option(config.assume_single_writer)
    publisher = storage.publisher_for(config.output)
    if not filesystem.is_remote(config.output):
        file_errors.check_writable(config.output, "output")  # before the source is fetched or read
        filesystem.remove_stale_temporaries(config.output)  # what a killed run left half-written
    resolved = resolve_source(config)
    parameters = config.output_parameters()
    existing, existing_bytes, existing_version = _published_manifest(publisher)
    if not config.force and _matches(existing, resolved.sha256, parameters):
        damaged = _damaged_shards(publisher, existing)
        if not damaged:
            logger.info("%s already holds this dataset (source %s); nothing to do", config.output, resolved.sha256[:12])
            return PrepareResult(config.output, existing, manifest_digest(existing_bytes), reused=True)
        logger.warning("published shards %s are missing or damaged; preparing the dataset again", damaged)

    raw = read_source(resolved, config)
    named_splits = splits.assign_splits(raw, config.validation_fraction, config.seed, config.shuffle)
    for split_name in ("train", "eval"):
        if not len(named_splits[split_name]):
            given = {name: len(split) for name, split in named_splits.items()}
            raise SourceError(
                f"{resolved.uri}: the {split_name} split is empty (split sizes {given}); nothing to publish"
            )
    check_classes_present(raw.label_names, named_splits["train"].labels, f"{resolved.uri} (train split)")
    removed = None
    if config.leakage != "keep":  # the leaks must be known before the shards are written: a pass of its own
        named_splits, removed = data_statistics.remove_leaks(named_splits, raw.label_names, config)
        check_classes_present(raw.label_names, named_splits["train"].labels, f"{resolved.uri} (train, leaks removed)")
    total = sum(len(split) for split in named_splits.values())
    progress = Progress("encode and publish", total, unit="images", logger=logger)

    key = dataset_key(resolved.sha256, parameters)
    written: set[str] = set()  # this run's shards: removed again if it does not publish its manifest
    try:
        split_infos, described = _publish_shards(
            publisher, named_splits, key, config, raw.label_names, progress, written
        )
        if removed is not None:
            described["leakage_removed"] = removed
        statistics_content = data_statistics.to_json(described)
        manifest = Manifest(
            schema_version=records.SCHEMA_VERSION,
            dataset=raw.dataset,
            synthetic=raw.dataset == "synthetic",
            source=raw.source,
            label_names=raw.label_names,
            image_shape=list(named_splits["train"].image_shape),
            compression=config.compression,
            parameters=parameters,
            splits=split_infos,
            statistics={"path": STATISTICS_NAME, "sha256": hashlib.sha256(statistics_content).hexdigest()},
        )
        content = manifest.to_json()
        publisher.swap_document(MANIFEST_NAME, content, existing_version)
        # After the manifest, which records its SHA-256: a writer that lost the race for the manifest never writes it
        publisher.publish(STATISTICS_NAME, statistics_content)
    except BaseException:  # a lost race, a full disk, a signal: leave no shard of this run behind
        _remove_shards_not_published(publisher, written, "unpublished")
        raise
    _remove_shards_not_published(publisher, _shard_paths(existing) - _shard_paths(manifest), "replaced")
    logger.info(
        "published %s: %s; manifest %s",
        config.output,
        ", ".join(f"{name} {info.num_examples}" for name, info in split_infos.items()),
        manifest_digest(content)[:12],
    )
    return PrepareResult(config.output, manifest, manifest_digest(content), reused=False)


def _publish_shards(publisher, named_splits, key, config, label_names, progress, written):
    """Encode and publish every split's shards (on threads), and describe them (statistics.json's content) from the
    same gathered pixels (on a thread of its own, in order; the search for duplicates while the last shards are
    written). Returns the splits' infos and the statistics; `written` collects each shard's name as it is started."""
    statistics = {name: data_statistics.SplitStatistics(len(label_names)) for name in named_splits}
    pending: dict[str, list] = {name: [] for name in named_splits}
    with ThreadPoolExecutor(PUBLISH_THREADS) as pool, ThreadPoolExecutor(1) as describing:
        # One BLAS thread while shards are encoded: the statistics keep to one core, the encoding to the other.
        with threadpool_limits(limits=1, user_api="blas"):
            described = []
            for split_name, split in named_splits.items():
                parts = shard_slices(len(split), config.examples_per_shard)
                for index, part in enumerate(parts):
                    name = shard_name(split_name, key, index, len(parts), config.compression)
                    images, labels, ids = split.images(part), split.labels[part], split.ids[part]
                    if len(described) >= 2:  # at most two shards' pixels wait for their statistics
                        described[-2].result()
                    described.append(
                        describing.submit(statistics[split_name].add, images, labels, ids, *split.source_facts(part))
                    )
                    content = records.encode_shard(images, labels, ids, config.compression)
                    written.add(name)
                    pending[split_name].append(pool.submit(_publish_shard, publisher, name, content, len(labels)))
                    progress.advance(len(labels))
            for future in described:
                future.result()
        document = data_statistics.document(label_names, statistics)
        split_infos = {
            split_name: SplitInfo(
                num_examples=len(split),
                class_counts=np.bincount(split.labels, minlength=len(label_names)).tolist(),
                shards=[future.result() for future in pending[split_name]],
            )
            for split_name, split in named_splits.items()
        }
    return split_infos, document


def _shard_paths(manifest: Manifest | None) -> set[str]:
    return set() if manifest is None else {shard.path for split in manifest.splits.values() for shard in split.shards}


def _remove_shards_not_published(publisher: stores.Publisher, candidates: set[str], kind: str) -> None:
    """Remove the `candidates` (shards this run knows to be garbage: its own after losing the race on the
    manifest, or those of the manifest it replaced) that the manifest published right now does not list. Never
    another shard: another run may have just written shards for the manifest it is about to publish."""
    if not candidates:
        return
    current, _content, _version = _published_manifest(publisher)
    for name in sorted(candidates - _shard_paths(current)):
        logger.info("removing %s shard %s", kind, publisher.uri(name))
        publisher.withdraw(name)
