"""Configuration of the prepare_data stage."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from components.common import records
from components.common.config import changed_fields, check_fields, setting_words
from components.common.dataset import MAX_IMAGE_SIDE

OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
OFFICIAL_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
SOURCE_FORMATS = ("auto", "python", "binary", "folders")
LEAKAGE_CHOICES = ("keep", "drop_from_train", "drop_from_eval")  # components/prepare_data/statistics.py
# The memory a prepare step's pod needs for each MB of its bound on a source (max_source_megabytes, which bounds both
# what the source unpacks to and its images decoded): the pipeline's default, 8 GiB for 1,024 MB. Set when the stage
# held the source in memory; it streams now (docs/prepare_data.md: 0.29 GB for CIFAR-10's archive, 1.10 GB for
# 737 MB of pixels), and the ratio stays for the per-image records, whose count only the source's bytes bound.
MEMORY_PER_SOURCE_MEGABYTE = 8
MINIMUM_STEP_MEMORY = 2 << 30  # the stage's own footprint (TensorFlow, its image codecs, the statistics) and room


def step_memory_needed(max_source_megabytes: int) -> int:
    """Bytes of memory a prepare step's pod needs to read a source of up to `max_source_megabytes` MB."""
    return max(MINIMUM_STEP_MEMORY, MEMORY_PER_SOURCE_MEGABYTE * (max_source_megabytes << 20))


def step_memory_quantity(max_source_megabytes: int) -> str:
    """step_memory_needed as a Kubernetes quantity (whole MiB): "8Gi", "12000Mi"."""
    needed = step_memory_needed(max_source_megabytes)
    return f"{needed >> 30}Gi" if needed % (1 << 30) == 0 else f"{needed >> 20}Mi"


@dataclass(frozen=True)
class PrepareDataConfig:
    output: str = field(metadata={"help": "output folder, gs:// or s3:// prefix for the shards and manifest"})
    source: str = field(
        default=OFFICIAL_URL,
        metadata={
            "help": "an http(s) URL, gs:// or s3:// URI, local .tar.gz or folder (official python or binary CIFAR-10 "
            "layout, or <split>/<class>/<image> folders), or 'synthetic'"
        },
    )
    source_format: str = field(
        default="auto", metadata={"help": "layout of the source; auto detects it", "choices": SOURCE_FORMATS}
    )
    source_sha256: str | None = field(
        default=None,
        metadata={"help": "expected SHA-256 of the source archive; the official URL's is known and always checked"},
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "where downloads are cached (default: $XDG_CACHE_HOME/cifar10-pipeline)"}
    )
    validation_fraction: float | None = field(
        default=None,
        metadata={
            "range": "[0, 1)",
            "help": "take a stratified, seeded validation split of this fraction of the training data (default: the "
            "source's own hold-out, data batch 5 or a validation/ folder, else 0.2)",
        },
    )
    seed: int = field(
        default=42, metadata={"range": "[0, 2147483647]", "help": "seed of the validation split and the shuffling"}
    )
    shuffle: bool = field(default=True, metadata={"help": "shuffle each split (seeded) before sharding"})
    examples_per_shard: int = field(
        default=5000, metadata={"range": "[1, 100000000]", "help": "records per shard (the last may hold fewer)"}
    )
    resize: str | None = field(
        default=None,
        metadata={
            "help": "HEIGHTxWIDTH (or N for NxN): resize every image to it (bilinear, antialiased), as Keras's "
            "image_dataset_from_directory(image_size=...) does; the model's input size is then that. Without it, "
            "the images of a folder must all have one size (the model's input size)"
        },
    )
    compression: str = field(
        default=records.COMPRESSION_NONE,
        metadata={"help": "shard compression", "choices": (records.COMPRESSION_NONE, records.COMPRESSION_GZIP)},
    )
    synthetic_train_per_class: int = field(
        default=200, metadata={"range": "[1, 100000]", "help": "with source 'synthetic': training images per class"}
    )
    synthetic_eval_per_class: int = field(
        default=50, metadata={"range": "[1, 100000]", "help": "with source 'synthetic': evaluation images per class"}
    )
    synthetic_classes: int = field(
        default=10, metadata={"range": "[2, 100]", "help": "with source 'synthetic': number of classes"}
    )
    leakage: str = field(
        default="keep",
        metadata={
            "help": "what to do with leaking images (a validation or test image with a near-duplicate in the training "
            "split): keep them (they are counted and listed in statistics.json), drop_from_train (remove the training "
            "copies) or drop_from_eval (remove the leaking validation and test images)",
            "choices": LEAKAGE_CHOICES,
        },
    )
    force: bool = field(default=False, metadata={"help": "rewrite even when the published dataset already matches"})
    assume_single_writer: bool = field(
        default=False,
        metadata={
            "help": "go on with an S3 store that does not honour conditional writes (MinIO before 2024, SeaweedFS "
            "before 4.17): you make sure one writer at a time uses each location, since concurrent writers are then "
            "not detected (also: CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER=1)"
        },
    )
    max_source_megabytes: int = field(
        default=1024,
        metadata={
            "range": "[1, 1048576]",
            "help": "the most a source may hold, unpacked, and its images decoded, in MB (CIFAR-10 is 180 MB either "
            "way, its JPEG copy 20 MB unpacked); bounds the memory a source can take",
        },
    )

    prepare_workers: int = field(
        default=1,
        metadata={
            "range": "[1, 64]",
            "help": "split the shards among this many workers: with --part all, local processes, merged here; in a "
            "pipeline, the pods of a ParallelFor (each its own --part), merged by a step of --part merge. The dataset "
            "is the same whatever the count",
        },
    )
    part: str = field(
        default="all",
        metadata={
            "help": "all: the whole dataset; an index 0..prepare_workers-1: only that worker's shards and partial "
            "statistics, into --output, no manifest; merge: the manifest and statistics from every worker's part "
            "already in --output"
        },
    )
    parts_from: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "with --part merge: where the workers published their parts, when not in --output (a pipeline's "
            "worker artifacts); their shards are copied into --output"
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.output:
            raise ValueError("output: must name a folder, gs:// or s3:// prefix")
        if self.resize is not None:
            parse_image_size(self.resize)
        if self.source_format not in SOURCE_FORMATS:
            raise ValueError(f"source_format: {self.source_format!r} is not one of {SOURCE_FORMATS}")
        if self.compression not in (records.COMPRESSION_NONE, records.COMPRESSION_GZIP):
            raise ValueError(f"compression: {self.compression!r} is not NONE or GZIP")
        if self.source_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", self.source_sha256):
            raise ValueError(f"source_sha256: {self.source_sha256!r} is not a 64-digit hex SHA-256")
        if self.part not in ("all", "merge") and not (self.part.isdigit() and int(self.part) < self.prepare_workers):
            raise ValueError(f"part: {self.part!r} is not all, merge or a worker's index 0..{self.prepare_workers - 1}")
        if self.parts_from and self.part != "merge":
            raise ValueError(f"parts_from: given with --part {self.part}; it names the workers' parts for --part merge")
        for location in self.parts_from:
            if not location:
                raise ValueError("parts_from: an empty location")
        of_a_file = changed_fields(self, ("source_format", "source_sha256"))
        if self.source == "synthetic" and of_a_file:
            setting, them = setting_words(of_a_file)
            raise ValueError(
                f"{', '.join(of_a_file)}: {setting} of a source that is read (an archive, a folder, a download), and "
                f"source synthetic is generated: leave {them} out"
            )

    @property
    def worker_index(self) -> int | None:
        """The worker this process is (`part` an index), or None."""
        return int(self.part) if self.part.isdigit() else None

    @property
    def max_source_bytes(self) -> int:
        return self.max_source_megabytes << 20

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) asked for by `resize`, or None."""
        return parse_image_size(self.resize) if self.resize else None

    def output_parameters(self) -> dict:
        """The options that determine the output's bytes (recorded in the manifest; a rerun compares them)."""
        parameters = {
            "source_format": self.source_format,
            "resize": list(self.image_size) if self.image_size else None,
            "validation_fraction": self.validation_fraction,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "examples_per_shard": self.examples_per_shard,
            "compression": self.compression,
            "leakage": self.leakage,
        }
        if self.source == "synthetic":
            parameters.update(
                synthetic_train_per_class=self.synthetic_train_per_class,
                synthetic_eval_per_class=self.synthetic_eval_per_class,
                synthetic_classes=self.synthetic_classes,
            )
        return parameters


def parse_image_size(text: str) -> tuple[int, int]:
    """ "64x48" -> (64, 48), "64" -> (64, 64); ValueError naming the field otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if not match:
        raise ValueError(f"resize: {text!r} is not HEIGHTxWIDTH or N (e.g. 32x32, 64)")
    height = int(match.group(1))
    width = int(match.group(2) or height)
    if not (1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
        raise ValueError(f"resize: {text!r}: each side must be in [1, {MAX_IMAGE_SIDE}]")
    return height, width
