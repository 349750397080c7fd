"""The prepare_data stage: source -> validated splits -> sharded, checksummed TFRecords + manifest.

Order of work, so that bad input publishes nothing and a reader never sees partial data:
1. resolve the source (download/cache, SHA-256 check) and compare with the published manifest: when the
   source digest and the output parameters match and every shard is intact, nothing is rewritten;
2. plan: read the source's index and labels, check them, assign the splits (and find leaks, when asked), and name
   the shards by a key of (schema, source digest, parameters), so writers of different data never touch each
   other's shards and the previous dataset stays readable meanwhile;
3. publish each shard atomically as its images are gathered (decoded, for image files) and encoded, with its
   statistics, in this process or shared among workers (`--prepare-workers`, a pipeline's ParallelFor) whose partial
   statistics are merged in shard order; an image that fails to decode stops the run here, its shards withdrawn;
4. replace the manifest last, as a compare-and-swap against the version read in step 1; a concurrent
   writer of different data makes this fail loudly instead of mixing datasets;
5. remove shards that no manifest refers to any more.
"""

from __future__ import annotations

import dataclasses
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
from components.prepare_data import fetch, sources, splits, synthetic, workers
from components.prepare_data import statistics as data_statistics
from components.prepare_data.config import OFFICIAL_SHA256, OFFICIAL_URL, PrepareDataConfig
from components.prepare_data.safe_io import DirTree, FileTree, SourceError, TarTree
from components.prepare_data.sources import RawDataset, RawSplit, check_classes_present, read_tree, resized_dataset

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
    archive: TarTree | None = None  # an archive source: its private copy, made by the read that hashed it

    def tree(self) -> FileTree:
        return self.folder or self.archive


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
    # One read of the archive: hashed as it is copied (decompressed) into a private scratch file, which every later
    # read takes its bytes from; what is converted is what was hashed, whatever happens to the file meanwhile.
    archive = TarTree(path, config.max_source_bytes, source, expected)
    return ResolvedSource(source, archive.sha256, path, max_bytes=config.max_source_bytes, archive=archive)


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
    raw.source.update(uri=published_uri(resolved.uri), sha256=resolved.sha256)
    return raw


def published_uri(uri: str) -> str:
    """The source as a published document names it: a URL without its query and fragment (a presigned URL's
    signature, a ?token=: credentials, never stored), said with '?...'."""
    if uri.startswith(("http://", "https://")) and ("?" in uri or "#" in uri):
        return uri.split("?", 1)[0].split("#", 1)[0] + "?..."
    return uri


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


@dataclass(frozen=True)
class Plan:
    """What every process of one prepare agrees on before a pixel is written: the source's examples assigned to
    splits (leaks removed, when asked), and the shards they make, each named by the dataset's key."""

    raw: RawDataset
    splits: dict[str, RawSplit]
    removed: dict | None  # what leakage removal took out (None: leaks kept)
    key: str
    shards: list[Shard]


@dataclass(frozen=True)
class Shard:
    split: str
    index: int
    examples: slice  # of the split
    name: str


def plan_dataset(resolved: ResolvedSource, config: PrepareDataConfig) -> Plan:
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
    key = dataset_key(resolved.sha256, config.output_parameters())
    shards = []
    for split_name, split in named_splits.items():
        parts = shard_slices(len(split), config.examples_per_shard)
        for index, part in enumerate(parts):
            shards.append(
                Shard(split_name, index, part, shard_name(split_name, key, index, len(parts), config.compression))
            )
    return Plan(raw, named_splits, removed, key, shards)


def prepare_data(config: PrepareDataConfig) -> PrepareResult | None:
    """The stage: the whole dataset (in this process, or in `config.prepare_workers` local worker processes merged
    here), one worker's part (`config.part` an index), or the merge of the workers' parts."""
    filesystem.apply_single_writer_option(config.assume_single_writer)
    publisher = storage.publisher_for(config.output)
    if config.worker_index is not None:
        prepare_part(config, publisher)
        return None
    if not filesystem.is_remote(config.output):
        file_errors.check_writable(config.output, "output")  # before the source is fetched or read
        filesystem.remove_stale_temporaries(config.output)  # what a killed run left half-written
    resolved = resolve_source(config)
    existing, existing_bytes, existing_version = _published_manifest(publisher)
    if not config.force and _matches(existing, resolved.sha256, config.output_parameters()):
        damaged = _damaged_shards(publisher, existing)
        if not damaged:
            logger.info("%s already holds this dataset (source %s); nothing to do", config.output, resolved.sha256[:12])
            return PrepareResult(config.output, existing, manifest_digest(existing_bytes), reused=True)
        logger.warning("published shards %s are missing or damaged; preparing the dataset again", damaged)
    plan = plan_dataset(resolved, config)
    written: set[str] = set()  # this run's shards: removed again if it does not publish its manifest
    try:
        if config.part == "all" and config.prepare_workers == 1:
            progress = Progress("encode and publish", sum(map(len, plan.splits.values())), unit="images", logger=logger)
            statistics, infos = _publish_shards(publisher, plan, plan.shards, config, progress, written)
        else:
            if config.part == "all" or config.parts_from:  # shards this run writes or copies
                written.update(shard.name for shard in plan.shards)
            if config.part == "all":  # the workers: fresh processes, each a pipeline's worker pod on this machine
                workers.run_local_workers(config.prepare_workers, lambda index: worker_command(config, index), plan.key)
            statistics, infos = _merged_parts(publisher, plan, config)
        _release_source(plan)
        manifest, content = _publish_manifest(publisher, plan, config, statistics, infos, existing_version)
    except BaseException:  # a lost race, a full disk, a signal: leave no shard of this run behind
        _remove_shards_not_published(publisher, written, "unpublished")
        if config.part == "all":
            _remove_parts(publisher, plan.key)
        raise
    sources.log_conversions(*plan.splits.values())
    _remove_shards_not_published(publisher, _shard_paths(existing) - _shard_paths(manifest), "replaced")
    _remove_parts(publisher, plan.key)
    logger.info(
        "published %s: %s; manifest %s",
        config.output,
        ", ".join(f"{name} {info.num_examples}" for name, info in manifest.splits.items()),
        manifest_digest(content)[:12],
    )
    return PrepareResult(config.output, manifest, manifest_digest(content), reused=False)


def _release_source(plan: Plan) -> None:
    """Every shard is written: the source's index of its files is let go before the search for duplicates (a name,
    an offset and a size a file: 60 MB at 600,000 image files)."""
    for split in plan.splits.values():
        for part in split.parts:
            if isinstance(part, sources.FolderImages):
                part.tree.close()


def _publish_manifest(publisher, plan: Plan, config, statistics, infos, existing_version) -> tuple[Manifest, bytes]:
    """statistics.json's document from the splits' merged statistics, and the manifest swapped in (then the
    statistics, whose SHA-256 it records: a writer that lost the race for the manifest never writes them)."""
    label_names = plan.raw.label_names
    described = data_statistics.document(label_names, statistics)
    if plan.removed is not None:
        described["leakage_removed"] = plan.removed
    statistics_content = data_statistics.to_json(described)
    split_infos = {
        split_name: SplitInfo(
            num_examples=len(split),
            class_counts=np.bincount(split.labels, minlength=len(label_names)).tolist(),
            shards=[infos[shard.name] for shard in plan.shards if shard.split == split_name],
        )
        for split_name, split in plan.splits.items()
    }
    manifest = Manifest(
        schema_version=records.SCHEMA_VERSION,
        dataset=plan.raw.dataset,
        synthetic=plan.raw.dataset == "synthetic",
        source=plan.raw.source,
        label_names=label_names,
        image_shape=list(plan.splits["train"].image_shape),
        compression=config.compression,
        parameters=config.output_parameters(),
        splits=split_infos,
        statistics={"path": STATISTICS_NAME, "sha256": hashlib.sha256(statistics_content).hexdigest()},
    )
    content = manifest.to_json()
    publisher.swap_document(MANIFEST_NAME, content, existing_version)
    publisher.publish(STATISTICS_NAME, statistics_content)
    return manifest, content


def _publish_shards(publisher, plan: Plan, shards: list[Shard], config, progress, written, on_shard=None):
    """Encode and publish `shards` (on threads), and describe each from the same gathered pixels (on a thread of its
    own). Returns each split's statistics (its shards', merged in order) and each shard's info by name; `written`
    collects each shard's name as it is started, and `on_shard(shard, statistics, info)` is called as each lands."""
    label_count = len(plan.raw.label_names)
    statistics = {name: data_statistics.SplitStatistics(label_count) for name in plan.splits}
    pending: list[tuple] = []
    # One BLAS thread while shards are encoded: the statistics keep to one core, the encoding to the other.
    with (
        ThreadPoolExecutor(PUBLISH_THREADS) as pool,
        ThreadPoolExecutor(1) as describing,
        threadpool_limits(limits=1, user_api="blas"),
    ):
        infos: dict[str, ShardInfo] = {}

        def land(entry) -> None:  # a shard's statistics merged in shard order, as its upload lands
            shard, counted, described, published = entry
            counted.result()
            infos[shard.name] = published.result()
            statistics[shard.split].merge(described)
            if on_shard is not None:
                on_shard(shard, described, infos[shard.name])

        for shard in shards:
            split = plan.splits[shard.split]
            images, sizes, colors = split.examples(shard.examples)
            labels, ids = split.labels[shard.examples], split.ids[shard.examples]
            if len(pending) >= 2:  # at most two shards' pixels wait for their statistics
                pending[-2][1].result()
            described = data_statistics.SplitStatistics(label_count)
            counted = describing.submit(described.add, images, labels, ids, sizes, colors)
            content = records.encode_shard(images, labels, ids, config.compression)
            written.add(shard.name)
            published = pool.submit(_publish_shard, publisher, shard.name, content, len(labels))
            pending.append((shard, counted, described, published))
            progress.advance(len(labels))
            while pending and pending[0][1].done() and pending[0][3].done():
                land(pending.pop(0))
        while pending:
            land(pending.pop(0))
    return statistics, infos


PARTS = ".parts"  # a fanned-out prepare's partial statistics, under the output, one pair of files a shard


def _part_names(key: str, shard: Shard) -> tuple[str, str]:
    """The shard's partial statistics (.npz) and its record (.json: the shard's info, written last)."""
    stem = f"{PARTS}/{key}/{shard.split}-{shard.index:05d}"
    return f"{stem}.npz", f"{stem}.json"


def prepare_part(config: PrepareDataConfig, publisher: stores.Publisher) -> None:
    """One worker of a fanned-out prepare, on its own (a pipeline's pod, or a local worker process): the plan, then
    `_publish_part`. A local worker's plan must be its run's (the same source read)."""
    plan = plan_dataset(resolve_source(config), config)
    workers.check_key(plan.key, config.source)
    _publish_part(publisher, plan, config, config.worker_index)


def worker_command(config: PrepareDataConfig, index: int) -> list[str]:
    """The command of local worker `index`: this stage's own CLI with the run's configuration, as `--part index`."""
    import sys

    from components.common.config import config_to_dict

    values = {**config_to_dict(config), "part": str(index)}
    return [sys.executable, "-m", "components.prepare_data", "--config", json.dumps(values, sort_keys=True)]


def _publish_part(publisher: stores.Publisher, plan: Plan, config: PrepareDataConfig, index: int) -> None:
    """Worker `index`'s share: every `prepare_workers`-th shard from the `index`-th, each published with its partial
    statistics and its record (after both: a record is never read before what it describes). A shard whose record and
    bytes are already there (a retried worker) is not done again."""
    count = config.prepare_workers
    mine = plan.shards[index::count]
    todo = [shard for shard in mine if _landed_part(publisher, plan.key, shard) is None]
    if len(todo) < len(mine):
        logger.info("worker %d of %d: %d of its %d shards are already published", index, count, len(mine) - len(todo),
                    len(mine))  # fmt: skip
    examples = sum(len(range(len(plan.splits[shard.split]))[shard.examples]) for shard in todo)
    progress = Progress(f"worker {index} of {count}: encode and publish", examples, unit="images", logger=logger)

    def record(shard: Shard, described: data_statistics.SplitStatistics, info: ShardInfo) -> None:
        statistics_name, record_name = _part_names(plan.key, shard)
        content = described.to_bytes()
        publisher.publish(statistics_name, content)
        document = {"shard": dataclasses.asdict(info), "statistics_sha256": hashlib.sha256(content).hexdigest()}
        publisher.publish(record_name, json.dumps(document, sort_keys=True).encode())

    _publish_shards(publisher, plan, todo, config, progress, set(), on_shard=record)
    sources.log_conversions(*plan.splits.values())
    logger.info("worker %d of %d: published %d shards of %s", index, count, len(mine), config.output)


def _landed_part(publisher: stores.Publisher, key: str, shard: Shard) -> tuple[ShardInfo, bytes] | None:
    """The shard's info and partial statistics when its record, its statistics and its bytes are all there and
    agree (None otherwise: not landed, or cut short)."""
    statistics_name, record_name = _part_names(key, shard)
    content = publisher.read(record_name)
    if content is None:
        return None
    try:
        document = json.loads(content)  # reader: a worker's record (bytes already read); its fields checked below
        info = ShardInfo(**document["shard"])
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{publisher.uri(record_name)}: not a prepare worker's record ({error})") from error
    if info.path != shard.name or publisher.checksum(shard.name) != (info.size_bytes, info.crc32c):
        return None
    statistics = publisher.read(statistics_name)
    if statistics is None or hashlib.sha256(statistics).hexdigest() != document["statistics_sha256"]:
        return None
    return info, statistics


def _merged_parts(publisher: stores.Publisher, plan: Plan, config: PrepareDataConfig):
    """Each split's statistics, its shards' partial statistics merged in shard order (the same additions as one
    process makes), and each shard's info; every shard must have landed whole, with the examples the plan gives it,
    in --output or in one of `config.parts_from` (from where it is copied, and checked again, into --output)."""
    label_count = len(plan.raw.label_names)
    statistics = {name: data_statistics.SplitStatistics(label_count) for name in plan.splits}
    infos = {}
    elsewhere = [storage.publisher_for(location) for location in config.parts_from if location != config.output]
    for shard in plan.shards:
        landed = _landed_part(publisher, plan.key, shard)
        for other in elsewhere:
            if landed is not None:
                break
            landed = _landed_part(other, plan.key, shard)
            if landed is not None:
                _copy_shard(other, publisher, landed[0])
        if landed is None:
            raise SourceError(
                f"{publisher.uri(shard.name)}: no worker published this shard whole (with --part merge, run every "
                f"--part 0..{config.prepare_workers - 1} first, to --output or to the --parts-from locations)"
            )
        info, content = landed
        described = data_statistics.SplitStatistics.from_bytes(content, publisher.uri(_part_names(plan.key, shard)[0]))
        if described.ids != plan.splits[shard.split].ids[shard.examples]:
            raise SourceError(f"{publisher.uri(shard.name)}: holds other examples than this source and these "
                               "parameters give it; the workers read another source")  # fmt: skip
        statistics[shard.split].merge(described)
        infos[shard.name] = info
    return statistics, infos


def _copy_shard(source: stores.Publisher, target: stores.Publisher, info: ShardInfo) -> None:
    """A worker's shard into the dataset, checked against its record on the way."""
    content = source.read(info.path)
    if content is None or hashlib.sha256(content).hexdigest() != info.sha256:
        raise RuntimeError(f"{source.uri(info.path)}: changed or went away while it was merged")
    target.publish(info.path, content)


def _remove_parts(publisher: stores.Publisher, key: str) -> None:
    for name in publisher.list(f"{PARTS}/{key}/"):
        publisher.withdraw(name)


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
