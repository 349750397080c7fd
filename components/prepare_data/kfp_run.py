"""What the prepare_data KFP component runs: its parameters -> a PrepareDataConfig -> the stage, into the dataset
artifact, whose metadata then describes the data."""

from __future__ import annotations

from typing import Any

from components.common import data_statistics, outputs
from components.common.filesystem import PublishConflictError
from components.common.kfp_parameters import config_from_parameters
from components.common.memory import reuse_freed_memory
from components.common.statistics_view import markdown
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import PrepareResult, prepare_data

# What ends the stage with one line and exit 2 (bad input, final), not a traceback; also its command line's.
EXPECTED_ERRORS = (ValueError, PublishConflictError)  # SourceError and DatasetError are ValueErrors


def dataset_metadata(result: PrepareResult) -> dict[str, Any]:
    """Artifact metadata that identifies the data itself, so downstream caching keys on content."""
    manifest = result.manifest
    return {
        "manifest_sha256": result.manifest_sha256,
        "source_sha256": manifest.source.get("sha256"),
        "dataset": manifest.dataset,
        "synthetic": manifest.synthetic,
        "num_classes": manifest.num_classes,
        "label_names": manifest.label_names,
        "num_examples": {name: split.num_examples for name, split in manifest.splits.items()},
        "schema_version": manifest.schema_version,
        "reused": result.reused,
    }


def run_prepare_data(dataset: Any, statistics: Any, **options: Any) -> PrepareResult:
    """Prepare the dataset into `dataset.path`, fill `dataset.metadata` and show its statistics in `statistics` (a
    Markdown page; runs as the step's own process)."""
    reuse_freed_memory()
    fingerprint = options.pop("source_fingerprint", "")
    collected = options.pop("parts", None) or []  # the fan-out's (pipeline/training_pipeline.py), else none
    parts = [location for location in collected if location]  # one worker's: ""
    if parts:
        options.update(part="merge", parts_from=tuple(parts))
    elif collected:  # a fan-out of one pod: this step prepares it all
        options["prepare_workers"] = 1
    # else: prepare_workers > 1 are processes of this step's pod
    config = config_from_parameters(
        PrepareDataConfig, {**options, "output": dataset.path}, "prepare_data component parameters"
    )
    result = prepare_data(config)
    dataset.metadata.update({**dataset_metadata(result), "source_fingerprint": fingerprint})
    described = data_statistics.dataset_statistics(config.output, result.manifest)
    title = f"Statistics of {result.manifest.dataset} ({config.source})"
    outputs.write_text(statistics.path, markdown(described, title=title), "statistics artifact")
    dataset.metadata["leakage"] = described["leakage"]
    return result


def run_prepare_part(part: Any, index: int, **options: Any) -> str:
    """Worker `index`'s share into the `part` artifact (nothing with one worker); returns the part's location ("":
    none), as the merge reads it."""
    options.pop("source_fingerprint", "")  # only the cache's key
    if options.get("prepare_workers", 1) <= 1:
        return ""
    reuse_freed_memory()
    config = config_from_parameters(
        PrepareDataConfig, {**options, "part": str(index), "output": part.path}, "prepare_part component parameters"
    )
    prepare_data(config)
    return part.uri
