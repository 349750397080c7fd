"""A prepared dataset's statistics read back, and the data check: what changed against a reference, and how much.

statistics.json is written by prepare_data (components/prepare_data/statistics.py) beside the manifest, which holds
its SHA-256; a promotion copies it into the version folder as data_statistics.json, so that a scheduled run finds
the data the promoted model was trained on. It is read here like every document (components/common/documents.py:
bounded, checked against STATISTICS_SCHEMA, one line naming the file and field otherwise).

The check (`check`) compares a dataset's statistics with a reference's, as TFX's ExampleValidator compares with a
schema and a previous span, and says what changed, and what kind of change it is, beyond thresholds a user can set
(`DataCheckConfig`):
- balance: a class missing or new, class shares (L-infinity distance, as TFDV measures categorical drift);
- the look of the images, told apart: brightness (mean luminance), contrast (each image's luminance spread), colour
  saturation, colour balance (a channel moving apart from the others once brightness and saturation are accounted
  for: a tint, or red and blue swapped), fine detail (blur, a lower resolution, compression; or noise), the layout
  of the mean image (rotated or flipped images), and, when none of these names it, the pixel values' histograms
  (Jensen-Shannon divergence, TFDV's numeric measure);
- labels, only where the look did not change: classes whose mean images are less distinct from each other than the
  reference's (labels shuffled within a share of the images), a class that looks like another (labels moved);
- source image sizes, colour conversions, the near-duplicate and leakage rates.
Each threshold is the least change a user would call one; on a small sample the limit is widened to what chance can
move the measure (CHANCE_Z standard errors, from the spreads the statistics record), so that an unchanged resample
is not a finding whatever its size (measured in bench/data_check.py). Without a reference it reports what needs none:
leaking images. Each finding has a severity: an "error" is what `data_check` acts on ("warn": say it; "block": no
promotion; "fail": the run stops), a "warning" is only said, a "note" says what could not be compared (a reference
written before a statistic was recorded).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from components.common import documents, filesystem, storage
from components.common.config import check_fields
from components.common.dataset import STATISTICS_NAME, DatasetError

DATA_CHECK_MODES = ("warn", "block", "fail")
PROMOTED_STATISTICS = "data_statistics.json"  # in a promoted version's folder
MAX_STATISTICS_BYTES = 8 << 20
ERROR, WARNING, NOTE = "error", "warning", "note"
CHANCE_Z = 5.0  # standard errors of the difference a measure may move by chance before it is a finding
PER_IMAGE = ("red", "green", "blue", "brightness", "contrast", "saturation", "detail")
LUMA = np.array([0.299, 0.587, 0.114])
LAYOUT_NOISE = 5.5  # the layout difference of two random samples of n images, times sqrt(n) (bench/data_check.py)
BLOCK_VARIANCE = 0.8  # the variance of an 8x8 block's mean over a pixel's, across images (CIFAR-10: 0.81)
MIN_CLASS_IMAGES = 100  # fewer images of a class, and its mean image says too little of its labels
# The 192 values of an 8x8 mean image move together: by chance its distance moves as if it had this many independent
# values (measured on CIFAR-10 resamples, bench/data_check.py: 5.5 times the spread 192 independent values give).
MEAN_IMAGE_EFFECTIVE_VALUES = 6
MAX_LOOK_RATIO = 1000.0  # a class's mean-image distance ratio is said as "over 1000" beyond this
# Moved labels leave a class's mean image within this fraction of the distance between its own class's and the other
# class's off the straight way between them (a mix of the two classes' images lies on it)
MAX_OFF_THE_WAY = 0.25

_COUNT = documents.Number("[0, 1e15]", integer=True)
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
        "channel_histogram": documents.Items(documents.Items(_COUNT, length=32), length=3),
        "saturation_histogram": documents.Items(_COUNT, length=16),
        "detail_histogram": documents.Items(_COUNT, length=32),
        "look_images": documents.Number("[0, 1e12]", integer=True),
        "per_image": documents.Fields(
            {
                name: documents.Fields(
                    {"mean": documents.Number("[-1e6, 1e6]"), "std": documents.Number("[0, 1e6]")},
                    required=("mean", "std"),
                )
                for name in PER_IMAGE
            },
            required=PER_IMAGE,
        ),
        "class_per_image": documents.Fields(
            {
                name: documents.Items(
                    documents.Items(documents.Number(bounds), length=len(PER_IMAGE)), max_items=100_000
                )
                for name, bounds in (("mean", "[-1e6, 1e6]"), ("std", "[0, 1e6]"))
            },
            required=("mean", "std"),
        ),
        "class_look_images": _COUNTS,
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
        "schema_version": documents.Number("[1, 2]", integer=True),
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
    content = storage.document_bytes(location, "dataset statistics", MAX_STATISTICS_BYTES)
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
        per_class = {
            key: split[key] for key in ("class_counts", "class_thumbnails", "class_look_images") if key in split
        }
        per_class.update({f"class_per_image.{key}": value for key, value in split.get("class_per_image", {}).items()})
        for key, values in per_class.items():
            if len(values) != classes:
                raise documents.DocumentError(
                    f"{location}: splits.{name}.{key}: {len(values)} entries for {classes} classes"
                )


def dataset_statistics(dataset_uri: str, manifest) -> dict | None:
    """The statistics of a prepared dataset (None when it was prepared before statistics were)."""
    if manifest.statistics is None:
        return None
    location = filesystem.join(dataset_uri, STATISTICS_NAME)
    try:
        return read_statistics(location, manifest.statistics["sha256"])
    except FileNotFoundError as error:
        raise DatasetError(f"{location}: missing; the manifest says it was written (prepare the data again)") from error


@dataclass(frozen=True)
class DataCheckConfig:
    """How much may change against the reference before the data check says so (each an "error" finding unless
    said otherwise)."""

    class_share_change: float = field(
        default=0.03,
        metadata={
            "range": "(0, 1]",
            "help": "the largest change of any class's share of a split (L-infinity distance, as TFDV measures it)",
        },
    )
    channel_mean_shift: float = field(
        default=0.1,
        metadata={
            "range": "(0, 100]",
            "help": "brightness: the mean luminance may move this many of the reference's pixel standard deviations",
        },
    )
    colour_shift: float = field(
        default=0.1,
        metadata={
            "range": "(0, 100]",
            "help": "colour balance: a channel's mean may move this many of its standard deviations apart from what "
            "brightness and saturation explain (a tint, channels swapped)",
        },
    )
    channel_spread_change: float = field(
        default=0.1,
        metadata={
            "range": "(0, 100]",
            "help": "contrast: the images' mean luminance spread may change by this fraction",
        },
    )
    saturation_change: float = field(
        default=0.15,
        metadata={"range": "(0, 100]", "help": "the images' mean colour saturation may change by this fraction"},
    )
    detail_change: float = field(
        default=0.1,
        metadata={
            "range": "(0, 100]",
            "help": "fine detail (blur, resolution, compression, noise) may change by this fraction",
        },
    )
    layout_change: float = field(
        default=0.25,
        metadata={
            "range": "(0, 100]",
            "help": "the mean image's pattern may move this much (RMS, in its own standard deviations): rotated or "
            "flipped images",
        },
    )
    pixel_divergence: float = field(
        default=0.02,
        metadata={
            "range": "(0, 1]",
            "help": "a channel's histogram may move this Jensen-Shannon divergence (TFDV's numeric measure) when no "
            "other measure names the change",
        },
    )
    label_noise: float = field(
        default=0.1,
        metadata={
            "range": "(0, 1]",
            "help": "labels shuffled: the classes' mean images may grow this fraction less distinct from each other",
        },
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
    severity: str  # ERROR, WARNING or NOTE
    message: str
    value: float | None = None
    threshold: float | None = None  # the limit the value met (the setting, or wider on a small sample)
    split: str | None = None
    class_name: str | None = None
    setting: str | None = None  # the DataCheckConfig field (data_thresholds name) that controls it

    def line(self) -> str:
        return f"{self.severity.upper()} finding: {self.kind.replace('_', ' ')}: {self.message}"


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
    less_detail: dict[str, bool] = {}
    for split in ("train", "eval"):
        mine, theirs = current["splits"].get(split), reference["splits"].get(split)
        if mine is None or theirs is None or not mine["count"] or not theirs["count"]:
            continue
        look = _look_findings(split, mine, theirs, thresholds)
        changed_look = [finding for finding in look if finding.severity == ERROR]
        findings += look
        findings += _class_findings(split, mine, theirs, names, reference_names, thresholds, changed_look)
        findings += _source_findings(split, mine, theirs, thresholds)
        blurred = any(finding.kind == "detail" and (finding.value or 0) < 0 for finding in changed_look)
        if blurred:
            less_detail[split] = True
    findings += _duplicate_findings(current, reference, thresholds, less_detail)
    return findings


def _limit(threshold: float, chance: float) -> float:
    return max(threshold, chance)


def _against(limit: float, threshold: float, setting: str, count: int) -> str:
    """How a measure compares with its limit, in words: "(>= 0.10, channel_mean_shift)", or when the sample is too
    small for the setting alone, "(>= 0.14: channel_mean_shift 0.1, widened by chance at 1,000 images)"."""
    if limit > threshold:
        return f"(>= {limit:.3g}: {setting} {threshold:g}, widened for what chance moves at {count:,} images)"
    return f"(>= {threshold:g}, {setting})"


def _class_findings(split, mine, theirs, names, reference_names, thresholds, changed_look) -> list[Finding]:
    findings = []
    shared = [name for name in names if name in reference_names]
    share = np.array(mine["class_counts"], float) / mine["count"]
    reference_share = np.array(theirs["class_counts"], float) / theirs["count"]
    for name in names:
        if (
            name in shared
            and mine["class_counts"][names.index(name)] == 0 < theirs["class_counts"][reference_names.index(name)]
        ):
            findings.append(Finding("class_missing", ERROR, f"{split}: class {name!r} has no images (the reference has "
                                    f"{theirs['class_counts'][reference_names.index(name)]})", split=split,
                                    class_name=name))  # fmt: skip
    changes = []
    for name in shared:
        mine_share, their_share = share[names.index(name)], reference_share[reference_names.index(name)]
        chance = CHANCE_Z * math.sqrt(
            max(mine_share * (1 - mine_share), 1e-4) / mine["count"] + their_share * (1 - their_share) / theirs["count"]
        )
        limit = _limit(thresholds.class_share_change, chance)
        changes.append((abs(mine_share - their_share) / limit, name, mine_share, their_share, limit))
    if changes:
        ratio, name, mine_share, their_share, limit = max(changes)
        if ratio >= 1:
            more = "more" if mine_share > their_share else "fewer"
            findings.append(
                Finding(
                    "class_balance", ERROR,
                    f"{split}: {more} {name!r} images: {mine_share:.1%} of the split, the reference's {their_share:.1%}"
                    f" (change {abs(mine_share - their_share):.1%} "
                    f"{_against(limit, thresholds.class_share_change, 'class_share_change', mine['count'])})",
                    abs(mine_share - their_share), limit, split, name, "class_share_change",
                )
            )  # fmt: skip
    if changed_look:  # the images changed: their classes' looks say nothing about the labels
        return findings
    labels = _label_noise(split, mine, theirs, names, reference_names, thresholds)
    labels += _moved_labels(split, mine, theirs, names, reference_names, thresholds)
    if labels or findings:  # the labels or the classes' counts moved: each class's look moves with them
        return findings + labels
    return findings + _class_look_findings(split, mine, theirs, names, reference_names, thresholds)


# A class's look compared: (measure, setting) of PER_IMAGE, with at least CLASS_LOOK_IMAGES images measured.
CLASS_LOOK_MEASURES = (("brightness", "channel_mean_shift"), ("contrast", "channel_spread_change"),
                       ("saturation", "saturation_change"), ("detail", "detail_change"))  # fmt: skip
CLASS_LOOK_IMAGES = 30
# A class's mean-image pattern moves by chance about 0.6 of the noise `_class_layout` reckons (at most 1.23 of it in
# 400 class resamples of CIFAR-10 at 200 and 1,000 images a class, measured as bench/data_check.py draws them): a
# finding from twice that.
CLASS_LAYOUT_Z = 2.0


def _class_look_findings(split, mine, theirs, names, reference_names, thresholds) -> list[Finding]:
    """A class whose images alone look otherwise (all grey, blurred, darker, turned) while the split as a whole held:
    images of one class from another source or processed otherwise, which a model learns as the class. Each measure
    against the split's own threshold, widened by chance at the class's count; one finding per class, naming every
    measure that moved. Looked for only when the classes' counts and labels held (a class grown with another's images
    looks otherwise, and that is said as the counts). A reference written before classes' looks were recorded: their
    layout alone."""
    findings = []
    for index, name in enumerate(names):
        if name not in reference_names:
            continue
        other = reference_names.index(name)
        moved = _class_layout(mine, theirs, index, other, thresholds)
        moved += _class_measures(mine, theirs, index, other, thresholds)
        if moved:
            findings.append(_class_look_finding(split, name, sorted(moved, reverse=True)))
    return findings


def _class_measures(mine, theirs, index, other, thresholds) -> list[tuple]:
    """The per-image measures (CLASS_LOOK_MEASURES) in which class `index`'s images differ from the reference's class
    `other`'s beyond the split's thresholds and chance: (how far beyond, words, setting, change, threshold, limit,
    count) each; none when either lacks them or has too few images measured. A change is the class's beyond the
    split's own (blank frames mixed into every class darken the bright classes most, but not them alone). Brightness
    is of every image (the class's channel means); the others of the images the look was measured on."""
    ours, reference = mine.get("class_per_image"), theirs.get("class_per_image")
    if ours is None or reference is None:
        return []
    look_counts = (
        (mine.get("class_look_images") or [0] * len(ours["mean"]))[index],
        (theirs.get("class_look_images") or [0] * len(reference["mean"]))[other],
    )
    every_counts = mine["class_counts"][index], theirs["class_counts"][other]
    scale = float(LUMA @ np.maximum(np.array(theirs["channel_std"]), 1e-6))  # brightness: in the pixels' spread
    split_changes = _split_changes(mine, theirs, scale)
    moved = []
    for measure, setting in CLASS_LOOK_MEASURES:
        column = PER_IMAGE.index(measure)
        if measure == "brightness" and mine.get("class_channel_mean") and theirs.get("class_channel_mean"):
            count, reference_count = every_counts
            value = float(LUMA @ np.array(mine["class_channel_mean"][index]))
            their_value = float(LUMA @ np.array(theirs["class_channel_mean"][other]))
        else:
            count, reference_count = look_counts
            value, their_value = ours["mean"][index][column], reference["mean"][other][column]
        if min(count, reference_count) < CLASS_LOOK_IMAGES:
            continue
        error = math.sqrt(ours["std"][index][column] ** 2 / count + reference["std"][other][column] ** 2 /
                          reference_count)  # fmt: skip
        if measure == "brightness":
            unit = scale
            change = (value - their_value) / scale - split_changes[measure]
        else:
            unit = max(abs(their_value), 1e-6)
            change = (value / unit) / (1 + split_changes[measure]) - 1
        threshold = getattr(thresholds, setting)
        limit = _limit(threshold, CHANCE_Z * error / unit)
        if abs(change) >= limit:
            moved.append((abs(change) / limit, _class_measure_words(measure, change, value, their_value), setting,
                          change, threshold, limit, count))  # fmt: skip
    return moved


def _split_changes(mine: dict, theirs: dict, scale: float) -> dict[str, float]:
    """The split's own change of each CLASS_LOOK_MEASURES measure (brightness: a shift in `scale`; the others: a
    fraction)."""
    changes = {"brightness": float(LUMA @ (np.array(mine["channel_mean"]) - np.array(theirs["channel_mean"]))) / scale}
    for measure, _setting in CLASS_LOOK_MEASURES[1:]:
        if mine.get("per_image") is None or theirs.get("per_image") is None:
            changes[measure] = 0.0
            continue
        ours, reference = mine["per_image"][measure]["mean"], theirs["per_image"][measure]["mean"]
        changes[measure] = ours / max(abs(reference), 1e-6) - 1
    return changes


def _class_layout(mine, theirs, index, other, thresholds) -> list[tuple]:
    """The class's mean image laid out otherwise than the reference class's (turned, flipped, framed otherwise),
    beyond what chance moves it at the two counts, while still nearer its own class's mean image than any other's."""
    count, reference_count = mine["class_counts"][index], theirs["class_counts"][other]
    if min(count, reference_count) < CLASS_LOOK_IMAGES:
        return []
    ours_image = np.array(mine["class_thumbnails"][index], float).reshape(8, 8, 3) @ LUMA
    their_image = np.array(theirs["class_thumbnails"][other], float).reshape(8, 8, 3) @ LUMA
    spread = float(their_image.std())
    if spread < 1e-6:
        return []
    ours, reference = _pattern(ours_image), _pattern(their_image)
    distance = float(np.sqrt(np.mean((ours - reference) ** 2)))
    luminance_spread = float(LUMA @ np.array(theirs["channel_std"]))
    noise = math.sqrt(BLOCK_VARIANCE * luminance_spread**2 * (1 / count + 1 / reference_count)) / spread
    threshold = thresholds.layout_change
    limit = _limit(threshold, CLASS_LAYOUT_Z * noise)
    if distance < limit:
        return []
    thumbnails = np.array(theirs["class_thumbnails"], float)
    squared = np.sum((thumbnails - np.array(mine["class_thumbnails"][index], float)) ** 2, axis=1)
    squared[np.array(theirs["class_counts"]) == 0] = np.inf
    if int(np.argmin(squared)) != other:
        return []  # nearer another class's mean image: its labels, which `_moved_labels` weighs
    turned = {name: float(np.sqrt(np.mean((ours - _pattern(turn(reference))) ** 2))) for name, turn in TURNS.items()}
    turn, best = min(turned.items(), key=lambda item: item[1])
    words = f"{turn}" if best < distance / 2 else "laid out otherwise in the frame"
    return [(distance / limit, f"{words} (mean-image difference {distance:.2f})", "layout_change", distance, threshold,
             limit, count)]  # fmt: skip


def _class_measure_words(measure: str, change: float, value: float, their_value: float) -> str:
    words = {
        "brightness": ("brighter", "darker"),
        "contrast": ("more contrast", "less contrast"),
        "saturation": ("more colour", "less colour"),
        "detail": ("more fine detail", "less fine detail"),
    }
    word = "grey (no colour)" if measure == "saturation" and value < 0.02 else words[measure][change < 0]
    amount = f"{change:+.2f} standard deviations" if measure == "brightness" else f"{change:+.0%}"
    return f"{word} ({measure} {value:.3g}, the reference's {their_value:.3g}: {amount})"


def _class_look_finding(split: str, name: str, moved: list) -> Finding:
    _ratio, _words, setting, change, threshold, limit, count = moved[0]
    return Finding(
        "class_look", ERROR,
        f"{split}: the {name!r} images alone look otherwise (beyond the split's own change): "
        f"{'; '.join(words for _r, words, *_ in moved)} "
        f"{_against(limit, threshold, setting, count)}, while the split as a whole held: images of this class from "
        "another source or processed otherwise (a model learns that as the class)",
        change, limit, split, name, setting,
    )  # fmt: skip


def _mean_image(split: dict) -> np.ndarray:
    """The split's mean image at 8x8 (its classes' mean images weighted by their counts), [8, 8, 3]."""
    thumbnails = np.array(split["class_thumbnails"], float).reshape(-1, 8, 8, 3)
    counts = np.array(split["class_counts"], float)
    return np.tensordot(counts, thumbnails, axes=1) / max(counts.sum(), 1)


def _pattern(image: np.ndarray, around: np.ndarray | None = None, scale: float | None = None) -> np.ndarray:
    """`image` less its per-channel mean (or less `around`), over its standard deviation (or `scale`): the pattern
    of light and colour over the frame, whatever the brightness and contrast."""
    centred = image - (image.mean(axis=(0, 1)) if around is None else around)  # per channel, when it has channels
    return centred / max(scale if scale is not None else float(centred.std()), 1e-6)


def _separations(split: dict, names: list[str], shared: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """How distinct each class's mean image is from the split's: its mean squared distance per value, in pixel
    variances, less what chance adds to a mean of its count of images (BLOCK_VARIANCE over the count); and the
    counts."""
    thumbnails = np.array(split["class_thumbnails"], float).reshape(len(names), -1)
    counts = np.array(split["class_counts"], float)
    mean = counts @ thumbnails / max(counts.sum(), 1)
    variance = float(np.mean(np.square(split["channel_std"]))) or 1.0
    indices = [names.index(name) for name in shared]
    squared = np.mean((thumbnails[indices] - mean) ** 2, axis=1) / variance
    return squared - BLOCK_VARIANCE / np.maximum(counts[indices], 1), counts[indices]


def _label_noise(split, mine, theirs, names, reference_names, thresholds) -> list[Finding]:
    """Labels shuffled within a share of the images pull every class's mean image towards the split's: the classes
    grow less distinct by about that share (measured on classes of MIN_CLASS_IMAGES images or more).

    Distinctness is measured in pixel variances, of the larger of the two splits' pixel spreads: a contrast lowered a
    little (less than the contrast finding's threshold) shrinks the classes' distances and the spread alike, and a
    share of images unlike the rest (blank frames, another source) widens the spread without moving the classes
    apart; neither is read as labels."""
    shared = [name for name in names if name in reference_names and
              mine["class_counts"][names.index(name)] >= MIN_CLASS_IMAGES and
              theirs["class_counts"][reference_names.index(name)] >= MIN_CLASS_IMAGES]  # fmt: skip
    if len(shared) < 2:
        return []
    ours, counts = _separations(mine, names, shared)
    reference, reference_counts = _separations(theirs, reference_names, shared)
    if reference.mean() <= 0:
        return []
    spread_ratio = float(np.mean(np.square(mine["channel_std"]))) / (
        float(np.mean(np.square(theirs["channel_std"]))) or 1
    )
    fall = 1 - math.sqrt(max(ours.mean(), 0) * max(spread_ratio, 1) / reference.mean())

    def variance(separation: np.ndarray, count: np.ndarray) -> float:  # of the mean of the classes' estimates
        each = 4 * np.maximum(separation, 0) * BLOCK_VARIANCE / count + 2 * (BLOCK_VARIANCE / count) ** 2
        each /= MEAN_IMAGE_EFFECTIVE_VALUES
        return float(each.sum()) / len(each) ** 2

    error = math.sqrt(variance(ours, counts) + variance(reference, reference_counts)) / (2 * reference.mean())
    limit = _limit(thresholds.label_noise, CHANCE_Z * error)
    if fall < limit:
        return []
    return [
        Finding(
            "label_noise", ERROR,
            f"{split}: the classes' mean images are {fall:.0%} less distinct from each other than the reference's, "
            f"while the images look the same: labels shuffled within about {fall:.0%} of the images "
            f"{_against(limit, thresholds.label_noise, 'label_noise', mine['count'])}",
            fall, limit, split, None, "label_noise",
        )
    ]  # fmt: skip


def _moved_labels(split, mine, theirs, names, reference_names, thresholds) -> list[Finding]:
    """A class whose mean image is nearer another reference class's than `class_look_change` times its own distance
    allows, lies on the way between the two (a mix of their images), and whose images' brightness, contrast, colour
    and detail are that class's: its images are that class's (labels moved)."""
    reference_thumbnails = np.array(theirs["class_thumbnails"], float)
    present = np.array(theirs["class_counts"]) > 0
    if mine.get("class_per_image") is not None and theirs.get("class_per_image") is not None:
        cause = "labels moved"
    else:  # the classes' brightness, colour and detail were not recorded in one of them
        cause = ("labels moved, or this class's images changed (the reference's statistics predate the classes' "
                 "looks; prepare it again to tell them apart)")  # fmt: skip
    findings = []
    for index, name in enumerate(names):
        if name not in reference_names or not mine["class_counts"][index]:
            continue
        own = reference_names.index(name)
        if not present[own]:
            continue
        squared = np.sum((reference_thumbnails - np.array(mine["class_thumbnails"][index], float)) ** 2, axis=1)
        # what chance adds to a squared distance of two class means of n and m images: 192 values, each of
        # BLOCK_VARIANCE of a pixel's variance, over n and over m
        variance = BLOCK_VARIANCE * float(np.mean(np.square(theirs["channel_std"])))
        counts = np.maximum(np.array(theirs["class_counts"], float), 1)
        noise = 192 * variance * (1 / mine["class_counts"][index] + 1 / counts)
        distances = np.sqrt(np.maximum(squared - noise, 0))
        distances[~present] = np.inf
        others = distances.copy()
        others[own] = np.inf
        nearest = int(np.argmin(others))
        if not math.isfinite(others[nearest]):
            continue
        ratio = min(distances[own] / max(others[nearest], 1e-9), MAX_LOOK_RATIO)
        beyond_chance = squared[own] - squared[nearest] >= CHANCE_Z * noise[own]  # not a small sample's wobble
        # nearer another class's mean image, but looking unlike its images (greyer, darker, blurred): the images of
        # this class changed, and `_class_look_findings` says so
        like_it = not _class_measures(mine, theirs, index, nearest, thresholds)
        # labels moved leave the class's mean image between its own and the other class's (a mix of their images);
        # images that changed (inverted, framed) leave it off that way, as far from the one as from the other
        own_image, other_image = reference_thumbnails[own], reference_thumbnails[nearest]
        way = other_image - own_image
        ours = np.array(mine["class_thumbnails"][index], float)
        along = float(np.clip((ours - own_image) @ way / max(float(way @ way), 1e-9), 0, 1))
        off_the_way = float(np.sum((ours - own_image - along * way) ** 2))
        between = off_the_way <= max(CHANCE_Z * noise[own], MAX_OFF_THE_WAY**2 * float(way @ way))
        if ratio >= thresholds.class_look_change and beyond_chance and like_it and between:
            findings.append(
                Finding(
                    "labels_moved", ERROR,
                    f"{split}: the images labelled {name!r} look more like the reference's "
                    f"{reference_names[nearest]!r} than like its {name!r} (mean-image distance {distances[own]:.1f} "
                    f"against {others[nearest]:.1f}, ratio {_ratio_text(ratio)} >= {thresholds.class_look_change:g}, "
                    f"class_look_change), while the images overall look the same: {cause}",
                    float(ratio), thresholds.class_look_change, split, name, "class_look_change",
                )
            )  # fmt: skip
    return findings


def _ratio_text(ratio: float) -> str:
    """A distance ratio in words; "over 1000" where the nearer distance is within what chance moves (about 0)."""
    return f"over {MAX_LOOK_RATIO:g}" if ratio >= MAX_LOOK_RATIO else f"{ratio:.2f}"


def _histograms(split: dict, name: str) -> np.ndarray | None:
    values = split.get(name)
    if values is None:
        return None
    array = np.asarray(values, float)
    return array / np.maximum(array.sum(axis=-1, keepdims=True), 1e-12)


def jensen_shannon(first: np.ndarray, second: np.ndarray) -> float:
    """The Jensen-Shannon divergence (base 2, in [0, 1]) of two histograms: TFDV's measure of numeric drift."""
    middle = (first + second) / 2

    def divergence(histogram: np.ndarray) -> float:
        present = histogram > 0
        return float(np.sum(histogram[present] * np.log2(histogram[present] / middle[present])))

    return (divergence(first) + divergence(second)) / 2


TURNS = {
    "rotated a quarter turn": lambda image: np.rot90(image, 1),
    "rotated a half turn": lambda image: np.rot90(image, 2),
    "rotated three quarters of a turn": lambda image: np.rot90(image, 3),
    "upside down": lambda image: image[::-1],
    "mirrored left to right": lambda image: image[:, ::-1],
}


def _look_findings(split: str, mine: dict, theirs: dict, thresholds: DataCheckConfig) -> list[Finding]:
    """What changed in how the images look, each measure against its threshold (widened by chance on a small
    sample), named by kind: brightness, contrast, saturation, colour balance, detail, layout, pixel values."""
    look = _Look(split, mine, theirs, thresholds)
    findings = [*look.brightness(), *look.contrast(), *look.saturation(), *look.colour(), *look.detail(),
                *look.layout()]  # fmt: skip
    if not findings:
        findings += look.pixel_values()
    if look.not_compared:
        findings.append(
            Finding(
                "not_compared",
                NOTE,
                f"{split}: not compared: {', '.join(look.not_compared)} (the reference's "
                "statistics were written before these were recorded; prepare it again to compare them)",
                split=split,
            )
        )
    return findings


class _Look:
    """The measures of `_look_findings`, each a method returning its findings."""

    def __init__(self, split: str, mine: dict, theirs: dict, thresholds: DataCheckConfig):
        self.split, self.mine, self.theirs, self.thresholds = split, mine, theirs, thresholds
        # the images the look was measured on (a systematic sample of a large dataset's)
        self.count = mine.get("look_images", mine["count"]) or mine["count"]
        self.reference_count = theirs.get("look_images", theirs["count"]) or theirs["count"]
        self.per_image, self.reference_per_image = mine.get("per_image"), theirs.get("per_image")
        self.not_compared: list[str] = []
        self.means, self.reference_means = np.array(mine["channel_mean"]), np.array(theirs["channel_mean"])
        self.reference_stds = np.maximum(np.array(theirs["channel_std"]), 1e-6)

    def _chance(self, measure: str, scale: float) -> float:
        """CHANCE_Z standard errors of the difference of `measure`'s means, in units of `scale` (0 without spreads)."""
        if self.per_image is None or self.reference_per_image is None:
            return 0.0
        mine, theirs = self.per_image[measure]["std"], self.reference_per_image[measure]["std"]
        # the channels' means (and the brightness made of them) are of every image; the other measures' of the
        # images the look was measured on
        every = measure in ("red", "green", "blue", "brightness")
        count = self.mine["count"] if every else self.count
        reference_count = self.theirs["count"] if every else self.reference_count
        error = math.sqrt(mine**2 / max(count, 1) + theirs**2 / max(reference_count, 1))
        return CHANCE_Z * error / max(scale, 1e-6)

    def _finding(self, kind: str, text: str, value: float, threshold: float, limit: float, setting: str) -> Finding:
        return Finding(kind, ERROR, f"{self.split}: {text} {_against(limit, threshold, setting, self.count)}",
                       value, limit, self.split, None, setting)  # fmt: skip

    def _measure(self, name: str) -> tuple[float, float] | None:
        if self.per_image is None or self.reference_per_image is None:
            return None
        return self.per_image[name]["mean"], self.reference_per_image[name]["mean"]

    def brightness(self) -> list[Finding]:
        scale = float(LUMA @ self.reference_stds)
        luminance, reference = float(LUMA @ self.means), float(LUMA @ self.reference_means)
        shift = (luminance - reference) / scale
        threshold = self.thresholds.channel_mean_shift
        limit = _limit(threshold, self._chance("brightness", scale))
        if abs(shift) < limit:
            return []
        word = "brighter" if shift > 0 else "darker"
        return [self._finding("brightness", f"{word} images: mean luminance {luminance:.1f}, the reference's "
                              f"{reference:.1f}, a shift of {shift:+.2f} standard deviations", shift, threshold,
                              limit, "channel_mean_shift")]  # fmt: skip

    def contrast(self) -> list[Finding]:
        measured = self._measure("contrast")
        threshold = self.thresholds.channel_spread_change
        if measured is None:  # an earlier release's statistics: the channels' spreads
            ours, reference = float(np.mean(self.mine["channel_std"])), float(np.mean(self.theirs["channel_std"]))
            limit = threshold
        else:
            ours, reference = measured
            limit = _limit(threshold, self._chance("contrast", reference))
        change = ours / max(reference, 1e-6) - 1
        if abs(change) < limit:
            return []
        word = "more" if change > 0 else "less"
        return [self._finding("contrast", f"{word} contrast: the images' luminance spread {ours:.1f}, the reference's "
                              f"{reference:.1f} (change {change:+.0%})", change, threshold, limit,
                              "channel_spread_change")]  # fmt: skip

    def saturation(self) -> list[Finding]:
        measured = self._measure("saturation")
        if measured is None:
            self.not_compared.append("colour saturation")
            return []
        ours, reference = measured
        threshold = self.thresholds.saturation_change
        limit = _limit(threshold, self._chance("saturation", reference))
        change = ours / max(reference, 1e-6) - 1
        if abs(change) < limit:
            return []
        what = "grey images (no colour)" if ours < 0.02 else ("less colour" if change < 0 else "more colour")
        return [self._finding("saturation", f"{what}: mean colour saturation {ours:.3f}, the reference's "
                              f"{reference:.3f} (change {change:+.0%})", change, threshold, limit,
                              "saturation_change")]  # fmt: skip

    def colour(self) -> list[Finding]:
        """Each channel against what brightness and saturation explain: the reference's channel offsets from its
        luminance, scaled by the saturation's change, on the new luminance; and the channels read in another order
        (their means per class match the reference's with the channels permuted)."""
        order = self._channel_order()
        if order is not None:
            return [order]
        measured = self._measure("saturation")
        factor = measured[0] / max(measured[1], 1e-6) if measured else 1.0
        luminance, reference = float(LUMA @ self.means), float(LUMA @ self.reference_means)
        expected = luminance + factor * (self.reference_means - reference)
        offsets = (self.means - expected) / self.reference_stds
        channel = int(np.argmax(np.abs(offsets)))
        threshold = self.thresholds.colour_shift
        colour = ("red", "green", "blue")[channel]
        limit = _limit(threshold, self._chance(colour, float(self.reference_stds[channel])))
        if abs(offsets[channel]) < limit:
            return []
        shifts = ", ".join(f"{name} {offset:+.2f}" for name, offset in zip(("red", "green", "blue"), offsets,
                                                                              strict=True))  # fmt: skip
        what = f"a {'warmer' if offsets[0] > offsets[2] else 'cooler'} tint"
        return [self._finding("colour_balance", f"{what}: the channels' means moved apart by {shifts} standard "
                              "deviations beyond what brightness and saturation explain", float(offsets[channel]),
                              threshold, limit, "colour_shift")]  # fmt: skip

    def _channel_order(self) -> Finding | None:
        """The channels permuted, when the classes' channel means match the reference's far better so."""
        mine, theirs = self.mine.get("class_channel_mean"), self.theirs.get("class_channel_mean")
        if not mine or not theirs or len(mine) != len(theirs):
            return None
        present = (np.array(self.mine["class_counts"]) > 0) & (np.array(self.theirs["class_counts"]) > 0)
        ours, reference = np.array(mine, float)[present], np.array(theirs, float)[present]
        if not len(ours):
            return None
        as_is = float(np.mean(np.abs(ours - reference) / self.reference_stds))
        threshold = self.thresholds.colour_shift
        if as_is < threshold:
            return None
        orders = [order for order in itertools.permutations(range(3)) if order != (0, 1, 2)]
        distance, order = min((float(np.mean(np.abs(ours[:, list(order)] - reference) / self.reference_stds)), order)
                              for order in orders)  # fmt: skip
        if distance >= as_is / 3:
            return None
        names = "".join("RGB"[index] for index in order)
        what = "red and blue swapped (images read as BGR?)" if names == "BGR" else f"the channels in {names} order"
        return self._finding("colour_balance", f"{what}: the classes' channel means match the reference's so "
                             f"({distance:.2f} standard deviations apart, {as_is:.2f} as they are)", as_is,
                             threshold, threshold, "colour_shift")  # fmt: skip

    def detail(self) -> list[Finding]:
        measured = self._measure("detail")
        if measured is None:
            self.not_compared.append("fine detail")
            return []
        ours, reference = measured
        threshold = self.thresholds.detail_change
        limit = _limit(threshold, self._chance("detail", reference))
        change = ours / max(reference, 1e-6) - 1
        if abs(change) < limit:
            return []
        what = ("less fine detail: blurred, upscaled from a lower resolution, or compressed harder" if change < 0 else
                "more fine detail: noise, or sharpened")  # fmt: skip
        return [self._finding("detail", f"{what} (fine detail {ours:.3f} per unit of contrast, the reference's "
                              f"{reference:.3f}, change {change:+.0%})", change, threshold, limit,
                              "detail_change")]  # fmt: skip

    def layout(self) -> list[Finding]:
        """Where light and dark lie in the mean image (its luminance: colour changes are the other measures')."""
        ours = _pattern(_mean_image(self.mine) @ LUMA)
        reference = _pattern(_mean_image(self.theirs) @ LUMA)
        distance = float(np.sqrt(np.mean((ours - reference) ** 2)))
        threshold = self.thresholds.layout_change
        chance = 2 * LAYOUT_NOISE * math.sqrt(1 / max(self.count, 1) + 1 / max(self.reference_count, 1))
        limit = _limit(threshold, chance)
        if distance < limit:
            return []
        turned = {name: float(np.sqrt(np.mean((ours - _pattern(turn(reference))) ** 2))) for name, turn in
                  TURNS.items()}  # fmt: skip
        name, best = min(turned.items(), key=lambda item: item[1])
        what = (f"the images look {name}: their mean image matches the reference's {name} ({best:.2f} against "
                f"{distance:.2f} as they are)" if best < distance / 2 else
                "the light and colour are laid out otherwise in the frame (another framing or camera?)")  # fmt: skip
        return [self._finding("layout", f"{what}; mean-image difference {distance:.2f}", distance, threshold, limit,
                              "layout_change")]  # fmt: skip

    def pixel_values(self) -> list[Finding]:
        ours, reference = _histograms(self.mine, "channel_histogram"), _histograms(self.theirs, "channel_histogram")
        if ours is None or reference is None:
            self.not_compared.append("pixel histograms")
            return []
        divergences = [jensen_shannon(ours[channel], reference[channel]) for channel in range(3)]
        channel = int(np.argmax(divergences))
        threshold = self.thresholds.pixel_divergence
        # n images' histogram is off its distribution's by about 22/n (31 bins; an image's pixels go together)
        limit = _limit(threshold, 50 * (1 / max(self.count, 1) + 1 / max(self.reference_count, 1)))
        if divergences[channel] < limit:
            return []
        colour = ("red", "green", "blue")[channel]
        return [self._finding("pixel_values", f"the {colour} channel's values are spread otherwise (Jensen-Shannon "
                              f"divergence {divergences[channel]:.3f}) though brightness, contrast and colour held: "
                              "another camera, or other processing", divergences[channel], threshold, limit,
                              "pixel_divergence")]  # fmt: skip


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


def _duplicate_findings(
    current: dict, reference: dict, thresholds: DataCheckConfig, less_detail: dict[str, bool] | None = None
) -> list[Finding]:
    findings = []
    rates, reference_rates = _duplicate_rates(current), _duplicate_rates(reference)
    for (split, other), rate in sorted(rates.items()):
        before = reference_rates.get((split, other), 0.0)
        leaking = other == "train" and split != "train"
        threshold = thresholds.leakage_rate_change if leaking else thresholds.duplicate_rate_change
        if rate - before < threshold:
            continue
        where = "the training split" if other == "train" else f"the {other} split"
        blurred = (less_detail or {}).get(split) or (less_detail or {}).get(other)
        setting = "leakage_rate_change" if leaking else "duplicate_rate_change"
        cause = (": images with less fine detail look alike more often; check the leakage again once the detail is "
                 "back" if blurred else ": test images leak into training" if leaking else "")  # fmt: skip
        findings.append(
            Finding(
                "leakage" if leaking else "duplicates",
                ERROR if leaking and not blurred else WARNING,
                f"{split}: {rate:.1%} of the images have a near-duplicate in {where}, the reference's {before:.1%} "
                f"(rise {rate - before:.1%} >= {threshold:.1%}, {setting}){cause}",
                rate - before, threshold, split, None, setting,
            )
        )  # fmt: skip
    return findings


def summary_line(findings: list[Finding]) -> str:
    """The run's findings in one line: "2 errors (brightness, contrast), 1 warning (image_sizes)"; "nothing found"."""
    parts = []
    for severity, word in ((ERROR, "error"), (WARNING, "warning"), (NOTE, "note")):
        kinds = sorted({finding.kind for finding in findings if finding.severity == severity})
        count = sum(finding.severity == severity for finding in findings)
        if count:
            parts.append(f"{count} {word}{'s' if count > 1 else ''} ({', '.join(kinds)})")
    return ", ".join(parts) or "nothing found"


def blocking(findings: list[Finding]) -> str:
    """One line naming the error findings ("" when there is none): what blocks a promotion or fails a run."""
    errors = [finding for finding in findings if finding.severity == ERROR]
    if not errors:
        return ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"data check: {errors[0].message}{more}"


def findings_json(findings: list[Finding], reference: str, mode: str) -> dict:
    return {"mode": mode, "reference": reference, "findings": [asdict(finding) for finding in findings]}
