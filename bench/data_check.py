"""Benchmark: the data check on real images: which changes it finds, how it names them, and how often it cries wolf.

The JPEG copy of CIFAR-10 (../shared/data, through bench/prepare_data.py's archive) is cut in two halves per class.
The reference is one half's statistics (25,000 training and 5,000 test images), computed by prepare_data's own code
(components/prepare_data/statistics.py), as a promoted model's data_statistics.json holds them. From the other half,
resamples of the sizes users have (SIZES training images, a fifth as many test images) are:
- left unchanged, RESAMPLES times per size: the share of them with any error finding is the false-alarm rate;
- changed, once per change and strength of the catalogue (CHANGES: class balance, classes missing or new, colour,
  brightness and contrast, resolution and blur, noise, compression, rotation and flips, labels shuffled, images of
  another source mixed in; one class's images changed alone; blank frames, grey images mixed in; inverted, gamma,
  zoomed, framed; labels swapped, off by one, classes merged): whether an error finding is made, and which kinds
  name it ("NAMED OTHERWISE" when not as expected, or when labels are blamed for a change of the images).
The data check (components/common/data_statistics.py `check`, its defaults) then compares each with the reference.
Prints the table and writes it, with the false-alarm rates, to bench/results/data-check-<date>.md.

    .venv/bin/python bench/data_check.py [--archive cifar-10-python.tar.gz] [--resamples 300] [--sizes 2000,10000]
"""

from __future__ import annotations

import argparse
import datetime
import io
import logging
import os
import pickle
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
sys.path.insert(0, str(REPOSITORY / "bench"))

import numpy as np  # noqa: E402
from prepare_data import official_archive  # noqa: E402

from components.common.data_statistics import ERROR, DataCheckConfig, check  # noqa: E402
from components.prepare_data import statistics  # noqa: E402

RESULTS = REPOSITORY / "bench" / "results"
CLASS = 3  # "cat": the class a balance change thins, grows or removes
Images = tuple[np.ndarray, np.ndarray]  # uint8 [n, 32, 32, 3], int64 [n]


def load_cifar(archive: Path) -> tuple[Images, Images, list[str]]:
    """(train, test, label names) of an official-layout python archive."""
    batches: dict[str, dict] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if name.startswith(("data_batch_", "test_batch", "batches.meta")):
                batches[name] = pickle.load(io.BytesIO(tar.extractfile(member).read()), encoding="bytes")

    def images(names: list[str]) -> Images:
        data = np.concatenate([batches[name][b"data"] for name in names])
        labels = np.concatenate([np.asarray(batches[name][b"labels"], np.int64) for name in names])
        return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels

    names = [name.decode() for name in batches["batches.meta"][b"label_names"]]
    return images([f"data_batch_{index}" for index in range(1, 6)]), images(["test_batch"]), names


def halves(split: Images, rng: np.random.Generator) -> tuple[Images, Images]:
    """Each class cut in two at random."""
    images, labels = split
    first, second = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        first.append(members[: len(members) // 2])
        second.append(members[len(members) // 2 :])
    one, two = np.sort(np.concatenate(first)), np.sort(np.concatenate(second))
    return (images[one], labels[one]), (images[two], labels[two])


def statistics_document(splits: dict[str, Images], label_names: list[str]) -> dict:
    """statistics.json's content for these splits, by prepare_data's own code."""
    described = {}
    for name, (images, labels) in splits.items():
        described[name] = statistics.SplitStatistics(len(label_names))
        sizes = np.full((len(images), 2), 32)
        for start in range(0, len(images), 4096):
            part = slice(start, start + 4096)
            ids = [f"{name}/{index}" for index in range(start, min(start + 4096, len(images)))]
            described[name].add(images[part], labels[part], ids, sizes[part], None)
    document, _leaks = statistics.dataset_statistics(label_names, described)
    return document


def resample(split: Images, size: int, rng: np.random.Generator) -> Images:
    chosen = rng.choice(len(split[1]), size, replace=False)
    return split[0][chosen], split[1][chosen]


# -- the catalogue of changes ------------------------------------------------------------------------------------


def _clip(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _resized(images: np.ndarray, height: int, width: int) -> np.ndarray:
    import tensorflow as tf

    return tf.image.resize(images.astype(np.float32), (height, width), antialias=True).numpy()


def lower_resolution(factor: float) -> Callable:
    def change(images, labels, rng):
        side = round(32 / factor)
        return _clip(_resized(_resized(images, side, side), 32, 32)), labels

    return change


def blurred(sigma: float) -> Callable:
    def change(images, labels, rng):
        radius = max(1, round(3 * sigma))
        kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
        kernel /= kernel.sum()
        padded = np.pad(images.astype(np.float32), ((0, 0), (radius, radius), (radius, radius), (0, 0)), "edge")
        rows = sum(weight * padded[:, index : index + 32] for index, weight in enumerate(kernel))
        return _clip(sum(weight * rows[:, :, index : index + 32] for index, weight in enumerate(kernel))), labels

    return change


def compressed(quality: int) -> Callable:
    def change(images, labels, rng):
        import tensorflow as tf

        out = [tf.io.decode_jpeg(tf.io.encode_jpeg(image, quality=quality)).numpy() for image in images]
        return np.stack(out), labels

    return change


def greyed(amount: float) -> Callable:
    """`amount` of the way to grey (1: no colour at all); a negative amount saturates."""

    def change(images, labels, rng):
        grey = (images.astype(np.float32) @ statistics.LUMA)[..., None]
        return _clip(images + amount * (grey - images)), labels

    return change


def shifted(red: float, green: float, blue: float) -> Callable:
    return lambda images, labels, rng: (_clip(images.astype(np.float32) + np.array([red, green, blue])), labels)


def contrast(factor: float) -> Callable:
    def change(images, labels, rng):
        mean = images.mean(axis=(1, 2, 3), keepdims=True)
        return _clip(mean + factor * (images - mean)), labels

    return change


def noise(sigma: float) -> Callable:
    return lambda images, labels, rng: (_clip(images + rng.normal(0, sigma, images.shape)), labels)


def thinned(keep: float) -> Callable:
    def change(images, labels, rng):
        members = np.flatnonzero(labels == CLASS)
        dropped = rng.choice(members, round(len(members) * (1 - keep)), replace=False)
        kept = np.setdiff1d(np.arange(len(labels)), dropped)
        return images[kept], labels[kept]

    return change


def grown(factor: float, pool: Images) -> Callable:
    def change(images, labels, rng):
        extra = round((factor - 1) * np.sum(labels == CLASS))
        members = rng.choice(np.flatnonzero(pool[1] == CLASS), extra, replace=False)
        return np.concatenate([images, pool[0][members]]), np.concatenate([labels, pool[1][members]])

    return change


def shuffled_labels(fraction: float) -> Callable:
    def change(images, labels, rng):
        chosen = rng.choice(len(labels), round(fraction * len(labels)), replace=False)
        labels = labels.copy()
        labels[chosen] = rng.permutation(labels[chosen])
        return images, labels

    return change


def other_source(fraction: float) -> Callable:
    """`fraction` of the images replaced by images of another kind (the project's synthetic stripes)."""

    def change(images, labels, rng):
        from components.prepare_data.synthetic import class_prototypes

        chosen = rng.choice(len(labels), round(fraction * len(labels)), replace=False)
        prototypes = class_prototypes(10)
        made = prototypes[labels[chosen]] + rng.normal(0, 20, (len(chosen), 32, 32, 3))
        images = images.copy()
        images[chosen] = _clip(made)
        return images, labels

    return change


def turned(kind: str) -> Callable:
    turn = {"rotated 90°": lambda x: np.rot90(x, 1, axes=(1, 2)), "rotated 180°": lambda x: x[:, ::-1, ::-1],
            "upside down": lambda x: x[:, ::-1], "mirrored": lambda x: x[:, :, ::-1]}[kind]  # fmt: skip
    return lambda images, labels, rng: (np.ascontiguousarray(turn(images)), labels)


def of_class(change: Callable) -> Callable:
    """`change` made to the images of CLASS alone."""

    def changed(images, labels, rng):
        chosen = labels == CLASS
        images = images.copy()
        images[chosen] = change(images[chosen], labels[chosen], rng)[0]
        return images, labels

    return changed


def of_share(fraction: float, change: Callable) -> Callable:
    """`change` made to `fraction` of the images, chosen at random."""

    def changed(images, labels, rng):
        chosen = rng.random(len(labels)) < fraction
        images = images.copy()
        images[chosen] = change(images[chosen], labels[chosen], rng)[0]
        return images, labels

    return changed


def relabelled(mapping: dict[int, int]) -> Callable:
    return lambda images, labels, rng: (images, np.array([mapping.get(int(label), int(label)) for label in labels]))


def replaced_by(fraction: float, other: int, pool: Images) -> Callable:
    """`fraction` of CLASS's images replaced by images of class `other` from `pool`, still labelled CLASS."""

    def change(images, labels, rng):
        members = np.flatnonzero(labels == CLASS)
        chosen = rng.choice(members, round(fraction * len(members)), replace=False)
        images = images.copy()
        images[chosen] = pool[0][rng.choice(np.flatnonzero(pool[1] == other), len(chosen), replace=False)]
        return images, labels

    return change


def zoomed(side: int) -> Callable:
    """The centre `side` x `side` of each image, upscaled to 32x32."""

    def change(images, labels, rng):
        start = (32 - side) // 2
        return _clip(_resized(images[:, start : start + side, start : start + side], 32, 32)), labels

    return change


def framed(side: int) -> Callable:
    """Each image shrunk to `side` x `side` in the middle of a black frame."""

    def change(images, labels, rng):
        start = (32 - side) // 2
        framed_images = np.zeros(images.shape, np.float32)
        framed_images[:, start : start + side, start : start + side] = _resized(images, side, side)
        return _clip(framed_images), labels

    return change


def pixel_map(function: Callable) -> Callable:
    return lambda images, labels, rng: (_clip(function(images.astype(np.float32))), labels)


def changes(pool: Images) -> list[tuple[str, str, Callable, str]]:
    """(family, strength, change, what the check should call it) for the catalogue."""
    return [
        ("class thinned", "half of one class gone", thinned(0.5), "class_balance"),
        ("class thinned", "a third gone", thinned(2 / 3), "class_balance"),
        ("class grown", "one class doubled", grown(2.0, pool), "class_balance"),
        ("class missing", "one class gone", thinned(0.0), "class_missing"),
        ("grey", "all colour gone", greyed(1.0), "saturation"),
        ("grey", "half the colour gone", greyed(0.5), "saturation"),
        ("saturation", "colour 1.5x", greyed(-0.5), "saturation"),
        ("channel order", "RGB read as BGR", lambda images, labels, rng: (images[..., ::-1].copy(), labels),
         "colour_balance"),
        ("tint", "+10 red, -10 blue", shifted(10, 0, -10), "colour_balance"),
        ("tint", "+5 red, -5 blue", shifted(5, 0, -5), "colour_balance"),
        ("brightness", "+10", shifted(10, 10, 10), "brightness"),
        ("brightness", "+5", shifted(5, 5, 5), "brightness"),
        ("brightness", "-10", shifted(-10, -10, -10), "brightness"),
        ("contrast", "halved", contrast(0.5), "contrast"),
        ("contrast", "0.8x", contrast(0.8), "contrast"),
        ("contrast", "1.25x", contrast(1.25), "contrast"),
        ("resolution", "half (16x16 upscaled)", lower_resolution(2), "detail"),
        ("resolution", "two thirds (21x21 upscaled)", lower_resolution(1.5), "detail"),
        ("blur", "gaussian sigma 1", blurred(1.0), "detail"),
        ("blur", "gaussian sigma 0.6", blurred(0.6), "detail"),
        ("noise", "gaussian sigma 10", noise(10), "detail"),
        ("noise", "gaussian sigma 5", noise(5), "detail"),
        ("compression", "JPEG quality 20", compressed(20), "detail"),
        ("compression", "JPEG quality 50", compressed(50), "detail"),
        ("rotation", "90°", turned("rotated 90°"), "layout"),
        ("rotation", "180°", turned("rotated 180°"), "layout"),
        ("flip", "upside down", turned("upside down"), "layout"),
        ("flip", "mirrored (left-right)", turned("mirrored"), "layout"),
        ("labels shuffled", "within 30% of the images", shuffled_labels(0.3), "label_noise"),
        ("labels shuffled", "within 15% of the images", shuffled_labels(0.15), "label_noise"),
        ("other source mixed in", "20% of the images", other_source(0.2), ""),
        ("other source mixed in", "10% of the images", other_source(0.1), ""),
        ("one class grey", "the 'cat' images", of_class(greyed(1.0)), "class_look"),
        ("one class blurred", "the 'cat' images, gaussian sigma 1", of_class(blurred(1.0)), "class_look"),
        ("one class noisy", "the 'cat' images, gaussian sigma 10", of_class(noise(10)), "class_look"),
        ("one class rotated", "the 'cat' images, 90°", of_class(turned("rotated 90°")), "class_look"),
        ("one class darker", "the 'cat' images, -20", of_class(shifted(-20, -20, -20)), "class_look"),
        ("one class inverted", "the 'cat' images, 255 - value", of_class(pixel_map(lambda images: 255 - images)),
         "class_look"),
        ("grey mixed in", "20% of the images", of_share(0.2, greyed(1.0)), "saturation"),
        ("blank frames mixed in", "5% black", of_share(0.05, pixel_map(lambda images: 0 * images)), ""),
        ("blank frames mixed in", "10% white", of_share(0.1, pixel_map(lambda images: 0 * images + 255)), ""),
        ("inverted", "255 - value", pixel_map(lambda images: 255 - images), "brightness"),
        ("gamma", "0.7", pixel_map(lambda images: 255 * (images / 255) ** 0.7), "brightness"),
        ("zoomed in", "the centre 24x24 upscaled", zoomed(24), "detail"),
        ("black frame", "shrunk to 24x24", framed(24), "layout"),
        ("labels swapped", "'cat' and 'dog'", relabelled({3: 5, 5: 3}), "labels_moved"),
        ("labels off by one", "every class the next's", relabelled({label: (label + 1) % 10 for label in range(10)}),
         "labels_moved"),
        ("classes merged", "every 'cat' called 'dog'", relabelled({3: 5}), "class_missing"),
        ("labels moved", "70% of the 'cat' images are trucks", replaced_by(0.7, 9, pool), "labels_moved"),
        ("labels moved", "70% of the 'cat' images are dogs", replaced_by(0.7, 5, pool), "labels_moved"),
    ]  # fmt: skip


LABEL_KINDS = {"label_noise", "labels_moved"}


def errors(findings) -> list[str]:
    return sorted({finding.kind for finding in findings if finding.severity == ERROR})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", help="an official-layout CIFAR-10 python archive (default: built from ../shared)")
    parser.add_argument("--resamples", type=int, default=300, help="unchanged resamples per size (false alarms)")
    parser.add_argument("--sizes", default="2000,10000", help="training images per resample (comma-separated)")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rng = np.random.default_rng(arguments.seed)
    train, test, names = load_cifar(official_archive(arguments.archive))
    (reference_train, held_train), (reference_test, held_test) = halves(train, rng), halves(test, rng)
    started = time.monotonic()
    reference = statistics_document({"train": reference_train, "eval": reference_test}, names)
    print(f"reference: {len(reference_train[1]):,} + {len(reference_test[1]):,} images "
          f"({time.monotonic() - started:.1f} s)")  # fmt: skip
    thresholds = DataCheckConfig()
    sizes = [int(size) for size in arguments.sizes.split(",")]
    lines = [f"# Data check on CIFAR-10 (JPEG copy), {datetime.date.today()}", "",
             f"Reference: half of each class ({len(reference_train[1]):,} training, {len(reference_test[1]):,} test "
             "images); resamples of the other half; the check's defaults.", ""]  # fmt: skip
    lines += ["## False alarms on unchanged resamples", "", "| training images | resamples | with an error finding "
              "| kinds |", "|---|---|---|---|"]  # fmt: skip
    for size in sizes:
        alarms, kinds = 0, Counter()
        started = time.monotonic()
        for _ in range(arguments.resamples):
            sample = {"train": resample(held_train, size, rng), "eval": resample(held_test, size // 5, rng)}
            found = errors(check(statistics_document(sample, names), reference, thresholds))
            alarms += bool(found)
            kinds.update(found)
        took = (time.monotonic() - started) / max(arguments.resamples, 1)
        row = f"| {size:,} | {arguments.resamples} | {alarms} ({alarms / max(arguments.resamples, 1):.1%}) | " \
              f"{', '.join(f'{kind} {count}' for kind, count in kinds.most_common()) or '-'} |"  # fmt: skip
        print(row, f"({took:.2f} s per resample)")
        lines.append(row)
    lines += ["", "## Changes", "", "| change | strength | expected | " + " | ".join(f"found at {size:,}" for size in
              sizes) + " |", "|---|---|---|" + "---|" * len(sizes)]  # fmt: skip
    for family, strength, change, expected in changes(held_train):
        cells = []
        for size in sizes:
            train_sample, eval_sample = resample(held_train, size, rng), resample(held_test, size // 5, rng)
            if family == "class missing":  # gone from every split
                eval_sample = change(*eval_sample, rng)
            changed = {"train": change(*train_sample, rng), "eval": eval_sample}
            found = errors(check(statistics_document(changed, names), reference, thresholds))
            named = (not expected or expected in found) and (expected in LABEL_KINDS or not LABEL_KINDS & set(found))
            cells.append(("yes: " if found and named else "NAMED OTHERWISE: " if found else "no") + ", ".join(found))
        row = f"| {family} | {strength} | {expected or 'any'} | " + " | ".join(cells) + " |"
        print(row)
        lines.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = RESULTS / f"data-check-{datetime.date.today():%Y-%m}.md"
    target.write_text("\n".join(lines) + "\n")
    print(f"written: {target}")


if __name__ == "__main__":
    main()
