"""A prepared dataset's statistics read back, and the data check: what changed against a reference, and how much.

statistics.json is written by prepare_data (components/prepare_data/statistics.py) beside the manifest, which holds
its SHA-256; a promotion copies it into the version folder as data_statistics.json, so that a scheduled run finds
the data the promoted model was trained on. It is read here like every document (components/common/documents.py:
bounded, checked against STATISTICS_SCHEMA, one line naming the file and field otherwise).

The check (`check`) compares a dataset's statistics with a reference's, as TFX's ExampleValidator compares with a
schema and a previous span, and says what changed beyond thresholds a user can set (`DataCheckConfig`): a class
missing or new, class shares (L-infinity distance, as TFDV measures categorical drift), images of a class that look
like another class's (labels moved), each channel's mean (a shift in the reference's standard deviations) and spread,
source image sizes, colour conversions, the near-duplicate and leakage rates. Without a reference it reports what
needs none: leaking images. Each finding has a severity: an "error" is what `data_check` acts on ("warn": say it;
"block": no promotion; "fail": the run stops), a "warning" is only said.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from components.common import documents, storage
from components.common.config import check_fields
from components.common.dataset import STATISTICS_NAME, DatasetError

DATA_CHECK_MODES = ("warn", "block", "fail")
PROMOTED_STATISTICS = "data_statistics.json"  # in a promoted version's folder
MAX_STATISTICS_BYTES = 8 << 20
ERROR, WARNING = "error", "warning"

_COUNTS = documents.Items(documents.Number("[0, 1e12]", integer=True), max_items=100_000)
_TRIPLE = documents.Items(documents.Number("[0, 255]"), length=3)
_SPLIT = documents.Fields(
    {
        "count": documents.Number("[0, 1e12]", integer=True),
        "class_counts": _COUNTS,
        "channel_mean": _TRIPLE,
        "channel_std": documents.Items(documents.Number("[0, 256]"), length=3),
        "class_channel_mean": documents.Items(_TRIPLE, max_items=100_000),
        "class_thumbnails": documents.Items(
            documents.Items(documents.Number("[0, 255]"), length=192), max_items=100_000
        ),
        "source_sizes": documents.ANY_OBJECT,
        "source_aspect_ratios": documents.ANY_OBJECT,
        "distinct_source_sizes": documents.Number("[0, 1e12]", integer=True),
        "converted_to_rgb": documents.ANY_OBJECT,
    },
    required=("count", "class_counts", "channel_mean", "channel_std", "class_thumbnails", "source_sizes"),
)
_PAIR = documents.Fields(
    {
        "id": documents.Text(),
        "other_id": documents.Text(),
        "similarity": documents.Number("[-1.01, 1.01]"),
        "exact": documents.Flag(),
    },
    required=("id", "other_id", "similarity", "exact"),
)
_COMPARISON = documents.Fields(
    {
        "split": documents.Text(("train", "validation", "eval")),
        "other": documents.Text(("train", "validation", "eval")),
        "near_duplicate_pairs": documents.Number("[0, 1e15]", integer=True),
        "exact_duplicate_pairs": documents.Number("[0, 1e15]", integer=True),
        "images_with_near_duplicate": documents.Number("[0, 1e12]", integer=True),
        "pairs": documents.Items(_PAIR, max_items=10_000),
    },
    required=("split", "other", "near_duplicate_pairs", "exact_duplicate_pairs", "images_with_near_duplicate"),
)
_PER_SPLIT_COUNT = documents.Fields(
    {name: documents.Number("[0, 1e12]", integer=True) for name in ("validation", "eval", "train")}, closed=True
)
STATISTICS_SCHEMA = documents.Fields(
    {
        "schema_version": documents.Number("[1, 1]", integer=True),
        "label_names": documents.Items(documents.Text(max_length=1024), max_items=100_000),
        "method": documents.ANY_OBJECT,
        "splits": documents.Fields(
            {"train": _SPLIT, "validation": _SPLIT, "eval": _SPLIT}, required=("train", "eval"), closed=True
        ),
        "duplicates": documents.Items(_COMPARISON, max_items=16),
        "leakage": _PER_SPLIT_COUNT,
        "leaking_ids": documents.Fields(
            {name: documents.Items(documents.Text(), max_items=100_000) for name in ("validation", "eval")},
            closed=True,
        ),
        "leakage_removed": documents.ANY_OBJECT,
    },
    required=("schema_version", "label_names", "splits", "duplicates", "leakage"),
)


def read_statistics(location: str, expected_sha256: str | None = None) -> dict:
    """The statistics document at `location` (a statistics.json or a promoted data_statistics.json), checked; with
    `expected_sha256` (the manifest's), also that it is the one the manifest was published with."""
    content = documents.read_bytes(location, "dataset statistics", MAX_STATISTICS_BYTES)
    if expected_sha256 is not None and hashlib.sha256(content).hexdigest() != expected_sha256:
        raise DatasetError(
            f"{location}: not the statistics its manifest was published with (SHA-256 differs): damaged, or written "
            "by another run; prepare the data again"
        )
    document = documents.parse(content, location, STATISTICS_SCHEMA, "dataset statistics")
    _check_consistent(document, location)
    return document


def _check_consistent(document: dict, location: str) -> None:
    classes = len(document["label_names"])
    for name, split in document["splits"].items():
        for key in ("class_counts", "class_thumbnails"):
            if len(split[key]) != classes:
                raise documents.DocumentError(
                    f"{location}: splits.{name}.{key}: {len(split[key])} entries for {classes} classes"
                )


def dataset_statistics(dataset_uri: str, manifest) -> dict | None:
    """The statistics of a prepared dataset (None when it was prepared before statistics were)."""
    if manifest.statistics is None:
        return None
    location = storage.join(dataset_uri, STATISTICS_NAME)
    try:
        return read_statistics(location, manifest.statistics["sha256"])
    except FileNotFoundError as error:
        raise DatasetError(f"{location}: missing; the manifest says it was written (prepare the data again)") from error


@dataclass(frozen=True)
class DataCheckConfig:
    """How much may change against the reference before the data check says so (each an "error" finding unless
    said otherwise)."""

    class_share_change: float = field(
        default=0.05,
        metadata={
            "range": "(0, 1]",
            "help": "the largest change of any class's share of a split (L-infinity distance, as TFDV measures it)",
        },
    )
    channel_mean_shift: float = field(
        default=0.25,
        metadata={"range": "(0, 100]", "help": "a channel's mean may move this many of the reference's std deviations"},
    )
    channel_spread_change: float = field(
        default=0.2, metadata={"range": "(0, 100]", "help": "a channel's std deviation may change by this fraction"}
    )
    class_look_change: float = field(
        default=1.0,
        metadata={
            "range": "(0, 100]",
            "help": "a class's mean image may move this fraction of the way to the nearest other class's (1: labels "
            "moved when a class's images look more like another class's than like their own)",
        },
    )
    size_share_change: float = field(
        default=0.1,
        metadata={"range": "(0, 1]", "help": "a warning: the largest change of any source image size's share"},
    )
    conversion_share_change: float = field(
        default=0.05,
        metadata={"range": "(0, 1]", "help": "a warning: the change of the share of images converted to RGB"},
    )
    duplicate_rate_change: float = field(
        default=0.02,
        metadata={"range": "(0, 1]", "help": "a warning: the rise of a split's share of images with a near-duplicate"},
    )
    leakage_rate_change: float = field(
        default=0.01,
        metadata={"range": "(0, 1]", "help": "the rise of a split's share of images leaking from the training split"},
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: str  # ERROR or WARNING
    message: str
    value: float | None = None
    threshold: float | None = None

    def line(self) -> str:
        return f"{self.severity.upper()} finding: {self.message}"


def check(current: dict, reference: dict | None, thresholds: DataCheckConfig) -> list[Finding]:
    """What changed from `reference` to `current` beyond `thresholds` (errors first); without a reference, what needs
    none."""
    findings = _leakage_alone(current) if reference is None else _compared(current, reference, thresholds)
    return sorted(findings, key=lambda finding: finding.severity != ERROR)


def _leakage_alone(current: dict) -> list[Finding]:
    findings = []
    for name, count in current["leakage"].items():
        if count:
            total = current["splits"][name]["count"]
            findings.append(
                Finding(
                    "leakage",
                    WARNING,
                    f"{count} of the {total} {name} images ({count / max(total, 1):.1%}) have a near-duplicate in the "
                    "training split (no reference to compare the rate with)",
                    count / max(total, 1),
                )
            )
    return findings


def class_shares(statistics: dict | None, split: str) -> dict[str, float]:
    """{class name: its share of `split`'s images} ({} when there is no such split, or no statistics)."""
    found = (statistics or {}).get("splits", {}).get(split)
    if not found:
        return {}
    total = max(found["count"], 1)
    return {name: count / total for name, count in zip(statistics["label_names"], found["class_counts"], strict=True)}


def _compared(current: dict, reference: dict, thresholds: DataCheckConfig) -> list[Finding]:
    findings = []
    names, reference_names = current["label_names"], reference["label_names"]
    missing = [name for name in reference_names if name not in names]
    new = [name for name in names if name not in reference_names]
    if missing:
        findings.append(Finding("class_missing", ERROR, f"class(es) {missing} of the reference are missing"))
    if new:
        findings.append(Finding("class_new", ERROR, f"class(es) {new} are new: the reference has none of them"))
    for split in ("train", "eval"):
        mine, theirs = current["splits"].get(split), reference["splits"].get(split)
        if mine is None or theirs is None or not mine["count"] or not theirs["count"]:
            continue
        findings += _class_findings(split, mine, theirs, names, reference_names, thresholds)
        findings += _pixel_findings(split, mine, theirs, thresholds)
        findings += _source_findings(split, mine, theirs, thresholds)
    findings += _duplicate_findings(current, reference, thresholds)
    return findings


def _class_findings(split, mine, theirs, names, reference_names, thresholds) -> list[Finding]:
    findings = []
    shared = [name for name in names if name in reference_names]
    share = np.array(mine["class_counts"], float) / mine["count"]
    reference_share = np.array(theirs["class_counts"], float) / theirs["count"]
    changes = {name: share[names.index(name)] - reference_share[reference_names.index(name)] for name in shared}
    for name in names:
        if (
            name in changes
            and mine["class_counts"][names.index(name)] == 0 < theirs["class_counts"][reference_names.index(name)]
        ):
            findings.append(Finding("class_missing", ERROR, f"{split}: class {name!r} has no images (the reference has "
                                    f"{theirs['class_counts'][reference_names.index(name)]})"))  # fmt: skip
    if changes:
        name, change = max(changes.items(), key=lambda item: abs(item[1]))
        if abs(change) >= thresholds.class_share_change:
            findings.append(
                Finding(
                    "class_balance",
                    ERROR,
                    f"{split}: class {name!r} is {share[names.index(name)]:.1%} of the images, the reference's "
                    f"{reference_share[reference_names.index(name)]:.1%} (change {abs(change):.1%} >= "
                    f"{thresholds.class_share_change:.1%})",
                    abs(change),
                    thresholds.class_share_change,
                )
            )
    findings += _moved_labels(split, mine, theirs, names, reference_names, thresholds)
    return findings


def _moved_labels(split, mine, theirs, names, reference_names, thresholds) -> list[Finding]:
    """A class whose mean image is nearer another reference class's than `class_look_change` times its own distance
    allows: its images look like that class's (labels moved, or another kind of image)."""
    reference_thumbnails = np.array(theirs["class_thumbnails"], float)
    present = np.array(theirs["class_counts"]) > 0
    findings = []
    for index, name in enumerate(names):
        if name not in reference_names or not mine["class_counts"][index]:
            continue
        own = reference_names.index(name)
        if not present[own]:
            continue
        distances = np.linalg.norm(reference_thumbnails - np.array(mine["class_thumbnails"][index], float), axis=1)
        distances[~present] = np.inf
        others = distances.copy()
        others[own] = np.inf
        nearest = int(np.argmin(others))
        if not math.isfinite(others[nearest]):
            continue
        ratio = distances[own] / max(others[nearest], 1e-9)
        if ratio >= thresholds.class_look_change:
            findings.append(
                Finding(
                    "labels_moved",
                    ERROR,
                    f"{split}: the images labelled {name!r} look more like the reference's "
                    f"{reference_names[nearest]!r} than like its {name!r} (mean-image distance {distances[own]:.1f} "
                    f"against {others[nearest]:.1f}): labels moved, or other images",
                    float(ratio),
                    thresholds.class_look_change,
                )
            )
    return findings


def _pixel_findings(split, mine, theirs, thresholds) -> list[Finding]:
    findings = []
    for channel, colour in enumerate(("red", "green", "blue")):
        mean, reference_mean = mine["channel_mean"][channel], theirs["channel_mean"][channel]
        spread, reference_spread = mine["channel_std"][channel], theirs["channel_std"][channel]
        shift = abs(mean - reference_mean) / max(reference_spread, 1e-6)
        if shift >= thresholds.channel_mean_shift:
            findings.append(
                Finding(
                    "channel_shift",
                    ERROR,
                    f"{split}: the {colour} channel's mean is {mean:.1f}, the reference's {reference_mean:.1f}: a "
                    f"shift of {shift:.2f} standard deviations (>= {thresholds.channel_mean_shift:g})",
                    shift,
                    thresholds.channel_mean_shift,
                )
            )
        change = abs(spread / max(reference_spread, 1e-6) - 1)
        if change >= thresholds.channel_spread_change:
            findings.append(
                Finding(
                    "channel_spread",
                    ERROR,
                    f"{split}: the {colour} channel's standard deviation is {spread:.1f}, the reference's "
                    f"{reference_spread:.1f} (change {change:.0%} >= {thresholds.channel_spread_change:.0%})",
                    change,
                    thresholds.channel_spread_change,
                )
            )
    return findings


def _shares(counts: dict, total: int) -> dict[str, float]:
    return {key: value / max(total, 1) for key, value in counts.items()}


def _source_findings(split, mine, theirs, thresholds) -> list[Finding]:
    findings = []
    sizes, reference_sizes = (
        _shares(mine["source_sizes"], mine["count"]),
        _shares(theirs["source_sizes"], theirs["count"]),
    )
    changes = {size: sizes.get(size, 0) - reference_sizes.get(size, 0) for size in {*sizes, *reference_sizes}}
    size, change = max(changes.items(), key=lambda item: (abs(item[1]), item[0]))
    if abs(change) >= thresholds.size_share_change:
        findings.append(
            Finding(
                "image_sizes",
                WARNING,
                f"{split}: {sizes.get(size, 0):.1%} of the images are {size} in the source, the reference's "
                f"{reference_sizes.get(size, 0):.1%} (change {abs(change):.1%} >= {thresholds.size_share_change:.1%})",
                abs(change),
                thresholds.size_share_change,
            )
        )
    converted = sum(mine.get("converted_to_rgb", {}).values()) / mine["count"]
    reference_converted = sum(theirs.get("converted_to_rgb", {}).values()) / theirs["count"]
    if abs(converted - reference_converted) >= thresholds.conversion_share_change:
        findings.append(
            Finding(
                "conversions",
                WARNING,
                f"{split}: {converted:.1%} of the images were converted to RGB (grayscale, palette, RGBA), the "
                f"reference's {reference_converted:.1%}",
                abs(converted - reference_converted),
                thresholds.conversion_share_change,
            )
        )
    return findings


def _duplicate_rates(document: dict) -> dict[tuple[str, str], float]:
    rates = {}
    for comparison in document["duplicates"]:
        total = document["splits"].get(comparison["split"], {}).get("count", 0)
        rates[(comparison["split"], comparison["other"])] = comparison["images_with_near_duplicate"] / max(total, 1)
    return rates


def _duplicate_findings(current: dict, reference: dict, thresholds: DataCheckConfig) -> list[Finding]:
    findings = []
    rates, reference_rates = _duplicate_rates(current), _duplicate_rates(reference)
    for (split, other), rate in sorted(rates.items()):
        before = reference_rates.get((split, other), 0.0)
        leaking = other == "train" and split != "train"
        threshold = thresholds.leakage_rate_change if leaking else thresholds.duplicate_rate_change
        if rate - before < threshold:
            continue
        where = "the training split" if other == "train" else f"the {other} split"
        findings.append(
            Finding(
                "leakage" if leaking else "duplicates",
                ERROR if leaking else WARNING,
                f"{split}: {rate:.1%} of the images have a near-duplicate in {where}, the reference's {before:.1%} "
                f"(rise {rate - before:.1%} >= {threshold:.1%})"
                + (": test images leak into training" if leaking else ""),
                rate - before,
                threshold,
            )
        )
    return findings


def blocking(findings: list[Finding]) -> str:
    """One line naming the error findings ("" when there is none): what blocks a promotion or fails a run."""
    errors = [finding for finding in findings if finding.severity == ERROR]
    if not errors:
        return ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"data check: {errors[0].message}{more}"


def findings_json(findings: list[Finding], reference: str, mode: str) -> dict:
    return {"mode": mode, "reference": reference, "findings": [asdict(finding) for finding in findings]}
