"""The data check step: a prepared dataset's statistics against a reference, before anything is trained on it.

The reference is, in order: `--reference` (a statistics.json, a promoted data_statistics.json, or a prepared
dataset's folder), else the promoted model's training data (`<promotion root>/<version>/data_statistics.json`,
recorded by the promotion), else none (only what needs no reference is checked). `mode` says what an error finding
does: "warn" logs it, "block" returns it (the gate then refuses to promote, naming it), "fail" stops the run (exit 2).

    python -m components.evaluate.data_check --data DATASET [--promotion-root ROOT] [--mode block]
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

from components.common import data_statistics, filesystem
from components.common.cli import run_stage
from components.common.config import check_fields
from components.common.data_statistics import DATA_CHECK_MODES, DataCheckConfig, Finding
from components.common.dataset import MANIFEST_NAME, STATISTICS_NAME, DatasetError, read_manifest
from components.evaluate.pointer import read_ready

logger = logging.getLogger(__name__)


class DataCheckFailedError(ValueError):
    """`mode` fail and an error finding: the run stops here (exit 2), the line names the finding."""


@dataclass(frozen=True)
class CheckDataConfig:
    data: str = field(metadata={"help": "the prepared dataset (folder, gs:// or s3:// prefix) to check"})
    mode: str = field(
        default="warn",
        metadata={
            "help": "what an error finding does: warn (log it), block (no promotion), fail (stop the run)",
            "choices": DATA_CHECK_MODES,
        },
    )
    reference: str = field(
        default="",
        metadata={
            "help": "the statistics to compare with: a statistics.json, a data_statistics.json or a prepared dataset "
            "(default: the promoted model's training data under --promotion-root)"
        },
    )
    promotion_root: str = field(default="", metadata={"help": "where the promoted model's data statistics are"})
    thresholds: dict = field(
        default_factory=dict,
        metadata={"help": 'DataCheckConfig fields by name, e.g. {"channel_mean_shift": 0.5} (JSON)'},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.data:
            raise ValueError("data: must name a prepared dataset")
        unknown = sorted(set(self.thresholds) - set(DataCheckConfig.__dataclass_fields__))
        if unknown:
            known = ", ".join(DataCheckConfig.__dataclass_fields__)
            raise ValueError(f"thresholds: {unknown[0]!r} is not a threshold (they are {known})")
        try:
            DataCheckConfig(**self.thresholds)  # each value in its interval
        except ValueError as error:
            raise ValueError(f"thresholds: {error}") from None


@dataclass(frozen=True)
class DataCheckOutcome:
    findings: list[Finding]
    reference: str  # what was compared with, said in words
    blocking: str  # "" or the line that blocks the promotion
    statistics: dict
    reference_statistics: dict | None

    def summary(self, mode: str) -> dict:
        return data_statistics.findings_json(self.findings, self.reference, mode) | {"blocking": self.blocking}


def reference_statistics(reference: str, promotion_root: str, synthetic: bool = False) -> tuple[dict | None, str]:
    """The reference's statistics (None when there is none) and what it is, in words; the promoted model's data is
    none for real data (`synthetic` False) when that model was the demo's, trained on synthetic data."""
    if reference:
        return _given_reference(reference), reference
    if not promotion_root:
        return None, "none (no promotion root and no data reference)"
    ready = read_ready(promotion_root)
    if ready is None:
        return None, f"none (nothing promoted under {promotion_root} yet)"
    location = filesystem.join(promotion_root, f"{ready['version']}/{data_statistics.PROMOTED_STATISTICS}")
    try:
        statistics = data_statistics.read_statistics(location)
    except FileNotFoundError:
        return None, f"none (version {ready['version']} was promoted without data statistics)"
    if ready.get("synthetic_data") and not synthetic:  # the demo's data: no reference for real data
        return None, f"none (version {ready['version']} was trained on synthetic data, the demo's)"
    return statistics, f"the training data of promoted version {ready['version']}"


def _given_reference(reference: str) -> dict:
    base = reference.rstrip("/")
    if base.endswith(".json"):
        try:
            return data_statistics.read_statistics(base)
        except FileNotFoundError as error:
            raise DatasetError(f"data reference {reference}: no such file") from error
    manifest, _digest = read_manifest(base)  # a prepared dataset: its statistics, as its manifest names them
    found = data_statistics.dataset_statistics(base, manifest)
    if found is None:
        raise DatasetError(
            f"data reference {filesystem.join(base, MANIFEST_NAME)}: prepared before statistics were; prepare it again"
        )
    return found


def check_data(config: CheckDataConfig) -> DataCheckOutcome:
    manifest, _digest = read_manifest(config.data)
    current = data_statistics.dataset_statistics(config.data, manifest)
    if current is None:
        raise DatasetError(
            f"{filesystem.join(config.data, STATISTICS_NAME)}: the dataset was prepared before statistics were; "
            "prepare it again to check it"
        )
    reference, described = reference_statistics(config.reference, config.promotion_root, manifest.synthetic)
    findings = data_statistics.check(current, reference, DataCheckConfig(**config.thresholds))
    logger.info("data check against %s: %s", described, data_statistics.summary_line(findings))
    for finding in findings:
        logger.info("%s", finding.line())
    blocking = data_statistics.blocking(findings)
    if blocking and config.mode == "fail":
        raise DataCheckFailedError(f"{blocking} (--data-check fail: the run stops; block or warn to go on)")
    if blocking and config.mode == "block":
        logger.warning("promotion blocked (--data-check block): no model trained on this data will be promoted: %s",
                       blocking)  # fmt: skip
    elif blocking:
        logger.warning("the data changed (--data-check warn: promotion goes on): %s", blocking)
    return DataCheckOutcome(findings, described, blocking if config.mode == "block" else "", current, reference)


def run(config: CheckDataConfig) -> int:
    outcome = check_data(config)
    print(json.dumps(outcome.summary(config.mode), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(
        CheckDataConfig,
        run,
        argv,
        "Check a prepared dataset's statistics against a reference (the promoted model's data, or one given).",
        "python -m components.evaluate.data_check",
        expected_errors=(ValueError,),
    )


if __name__ == "__main__":
    sys.exit(main())
