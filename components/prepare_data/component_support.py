"""What the KFP component does with its artifact: run the stage into it and describe the data in its metadata."""

from __future__ import annotations

from typing import Any

from components.common.memory import reuse_freed_memory
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import PrepareResult, prepare_data


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


def run_prepare_data(dataset: Any, **options: Any) -> PrepareResult:
    """Prepare the dataset into `dataset.path` and fill `dataset.metadata` (runs as the step's own process)."""
    reuse_freed_memory()
    fingerprint = options.pop("source_fingerprint", "")
    options["source_sha256"] = options.get("source_sha256") or None
    fraction = options.get("validation_fraction")
    options["validation_fraction"] = None if fraction is None or fraction < 0 else fraction
    result = prepare_data(PrepareDataConfig(output=dataset.path, **options))
    dataset.metadata.update({**dataset_metadata(result), "source_fingerprint": fingerprint})
    return result
