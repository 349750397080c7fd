"""Benchmark: near-duplicates and leakage on the real CIFAR-10 images, against the published figure.

Barz and Denzler ("Do we train on test data? Purging CIFAR of near-duplicates", J. Imaging 2020) found, by a CNN
feature search checked by hand, that 3.3% of CIFAR-10's test images have a near-duplicate in its training set. This
prepares ../shared/data's JPEG copy of CIFAR-10 (through the official layout, as bench/prepare_data.py does), reads
its statistics.json, and prints: the leaking test images found (count and share, against 3.3%); the cell search's
pairs against an exhaustive comparison of every pair (its recall, and the times of both); and the time the data check
adds to a run. It writes contact sheets of a seeded random sample of the leaking pairs (test image left, its training
near-duplicate right), one per band of similarity, to bench/work/near-duplicates-*.png, to be looked at by eye.

    .venv/bin/python bench/near_duplicates.py [--archive cifar-10-python.tar.gz] [--sample 40]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
sys.path.insert(0, str(REPOSITORY / "bench"))

import numpy as np  # noqa: E402
from prepare_data import WORK, official_archive  # noqa: E402

from components.common.data_statistics import dataset_statistics  # noqa: E402
from components.common.dataset import open_dataset, read_manifest  # noqa: E402
from components.common.memory import reuse_freed_memory  # noqa: E402
from components.evaluate.data_check import CheckDataConfig, check_data  # noqa: E402
from components.prepare_data import statistics  # noqa: E402
from components.prepare_data.config import PrepareDataConfig  # noqa: E402
from components.prepare_data.prepare import prepare_data  # noqa: E402

PUBLISHED_SHARE = 0.033  # of CIFAR-10's test images, Barz and Denzler 2020
BANDS = ((0.9, 0.95), (0.95, 0.98), (0.98, 1.01))


def images_by_id(dataset: str, split: str) -> dict[str, np.ndarray]:
    opened = open_dataset(dataset, splits=(split,))
    found = {}
    for images, _labels, ids in opened.tf_dataset(split, 4096, with_ids=True):
        for image, example_id in zip(images.numpy(), ids.numpy(), strict=True):
            found[example_id.decode()] = image
    return found


def contact_sheet(pairs: list[tuple[np.ndarray, np.ndarray]], path: Path, per_row: int = 5) -> None:
    import tensorflow as tf

    tiles = [
        np.pad(np.concatenate([left, np.full((32, 2, 3), 255, np.uint8), right], axis=1), ((3, 3), (6, 6), (0, 0)))
        for left, right in pairs
    ]
    while len(tiles) % per_row:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.concatenate(tiles[start : start + per_row], axis=1) for start in range(0, len(tiles), per_row)]
    sheet = np.concatenate(rows, axis=0)
    sheet = np.repeat(np.repeat(sheet, 3, axis=0), 3, axis=1)
    path.write_bytes(tf.io.encode_png(sheet).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", help="an official-layout CIFAR-10 python archive")
    parser.add_argument("--sample", type=int, default=40, help="pairs per contact sheet")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    reuse_freed_memory()
    archive = official_archive(arguments.archive)
    dataset = str(WORK / "near-duplicates-dataset")
    prepare_data(PrepareDataConfig(output=dataset, source=str(archive), validation_fraction=0.0))
    manifest, _digest = read_manifest(dataset)
    described = dataset_statistics(dataset, manifest)
    tests = described["splits"]["eval"]["count"]
    leaking = described["leakage"]["eval"]
    print(f"test images with a near-duplicate in training: {leaking} of {tests} ({leaking / tests:.2%}); "
          f"published: {PUBLISHED_SHARE:.1%} (Barz and Denzler 2020)")  # fmt: skip
    for comparison in described["duplicates"]:
        print(
            f"  {comparison['split']:>5} in {comparison['other']:<5}: {comparison['images_with_near_duplicate']:5d} "
            f"images, {comparison['near_duplicate_pairs']:6d} near pairs, "
            f"{comparison['exact_duplicate_pairs']:4d} exact"
        )

    train, test = images_by_id(dataset, "train"), images_by_id(dataset, "eval")
    features = statistics.descriptors(np.stack([*train.values(), *test.values()]).astype(np.float32))
    started = time.perf_counter()
    left, right, _similarity = statistics.near_duplicate_pairs(features)
    cell_seconds = time.perf_counter() - started
    started = time.perf_counter()
    every = statistics._pairs_exhaustive(features, statistics.NEAR_DUPLICATE_THRESHOLD)
    exhaustive_seconds = time.perf_counter() - started
    found = set(zip(left.tolist(), right.tolist(), strict=True))
    truth = set(zip(every[0].tolist(), every[1].tolist(), strict=True))
    print(
        f"cell search: {len(found & truth)} of the {len(truth)} pairs every-pair comparison finds "
        f"({len(found & truth) / max(len(truth), 1):.1%}), {cell_seconds:.2f} s against {exhaustive_seconds:.2f} s"
    )

    started = time.perf_counter()
    check_data(CheckDataConfig(data=dataset, reference=dataset, mode="warn"))
    print(f"the data check (against the same data's statistics): {time.perf_counter() - started:.2f} s")

    pairs = next(c for c in described["duplicates"] if c["split"] == "eval" and c["other"] == "train")["pairs"]
    rng = np.random.default_rng(0)
    for low, high in BANDS:
        chosen = [pair for pair in pairs if low <= pair["similarity"] < high]
        chosen = [chosen[index] for index in sorted(rng.permutation(len(chosen))[: arguments.sample])]
        if chosen:
            path = WORK / f"near-duplicates-{low:.2f}-{min(high, 1):.2f}.png"
            contact_sheet([(test[pair["id"]], train[pair["other_id"]]) for pair in chosen], path)
            print(f"{len(chosen)} pairs with similarity in [{low}, {min(high, 1.0)}): {path}")


if __name__ == "__main__":
    main()
