"""Benchmark: what prepare_data and its search for near-duplicates cost as the data grows, with the growth exponents.

At each size (60,000 and 600,000 images of 32x32 by default, `--sizes`), a source of class folders of PNG files is
made from ../shared/data's CIFAR-10 images: copy `c` of image `i` is the image rolled by (c, 2c) pixels, so the copies
are new images to the search, and the source's own near-duplicates recur in every copy (as a larger collection of
photographs would have them). It prints, per size:
- prepare_data in a process of its own, as the CLI runs it: wall time, time per image and peak memory (VmHWM);
- the search for near-duplicates on the images' descriptors: its time, and its recall against an exhaustive
  comparison of a seeded sample of `--sample` images with every image;
- the evaluate stage on the published dataset's test split (a tenth of the images), in a process of its own: wall
  time and peak memory, of a ResNet-20 trained one step (`--evaluate` off: not run);
and the growth exponent of each cost between the sizes (log of the cost's ratio over log of the size's: 1 is linear).
The baseline is prepare_data's cost at the smallest size, run in the same invocation.

    .venv/bin/python bench/scale.py [--sizes 60000,600000] [--sample 2000] [--workers 2] [--evaluate on]
    .venv/bin/python bench/scale.py --sizes 50000 --side 224 --workers 1    # CIFAR-10's images upscaled

The sources are kept in bench/work/scale-<size>.tar (1.8 GB at 600,000 images); a run takes about 10 minutes on
2 cores at the default sizes (20 minutes the first time, making the sources), most of it decoding PNG files.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from components.prepare_data import statistics  # noqa: E402

SHARED = REPOSITORY.parent / "shared"
WORK = REPOSITORY / "bench" / "work"
CIFAR_IMAGES = 60_000

PREPARE = """
import re, resource, sys, time
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
started = time.perf_counter()
result = prepare_data(PrepareDataConfig(source=sys.argv[1], output=sys.argv[2], cache_dir=sys.argv[3], force=True,
                                        max_source_megabytes=16384,  # 1.8 GB of files and of pixels at 600,000 images
                                        prepare_workers=int(sys.argv[4])))
took = time.perf_counter() - started
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest worker's (0: none)
used = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
           for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(result.manifest_sha256, took, max(peak, workers_peak), used / took)
"""


TRAIN_ONE_STEP = """
import sys
from components.train.config import TrainConfig
from components.train.loop import train
train(TrainConfig(data=sys.argv[1], model_dir=sys.argv[2], depth=20, train_steps=1, log_every_steps=1))
"""

EVALUATE = """
import re, sys, time
from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import evaluate
started = time.perf_counter()
result = evaluate(EvaluateConfig(data=sys.argv[1], model_dir=sys.argv[2], output_dir=sys.argv[3]))
took = time.perf_counter() - started
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
print(took, peak, len(result.final.probabilities))
"""


def cifar_images() -> tuple[np.ndarray, list[str], list[str]]:
    """The 60,000 images of ../shared/data's JPEG copy of CIFAR-10, their splits and classes, in a seeded order."""
    archive = SHARED / "data" / "cifar10-jpeg.tar.gz"
    if not archive.exists():
        sys.exit(f"{archive} not found: this benchmark needs the shared CIFAR-10 images")
    images, splits, classes = [], [], []
    with tarfile.open(archive) as source:  # reader: the shared benchmark data, a known archive of 20 MB
        for member in source:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 3 or not parts[-1].endswith(".jpg"):
                continue
            content = source.extractfile(member).read()
            images.append(np.asarray(Image.open(io.BytesIO(content)).convert("RGB")))  # reader: the same archive
            splits.append(parts[-3])
            classes.append(parts[-2])
    order = np.random.default_rng(0).permutation(len(images))  # every prefix holds both splits and every class
    return np.stack(images)[order], [splits[i] for i in order], [classes[i] for i in order]


def scaled_source(size: int, cifar: tuple[np.ndarray, list[str], list[str]], side: int = 32) -> Path:
    """bench/work/scale-<size>.tar (scale-<size>-<side>px.tar): `size` PNG files in <split>/<class>/ folders
    (uncompressed: PNG is), of `side` x `side` pixels (the images upscaled, bicubic)."""
    path = WORK / (f"scale-{size}.tar" if side == 32 else f"scale-{size}-{side}px.tar")
    if path.exists():
        return path
    images, splits, classes = cifar
    WORK.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".partial")
    started = time.perf_counter()
    with tarfile.open(temporary, "w") as archive:
        for index in range(size):
            copy, original = divmod(index, len(images))
            image = np.roll(images[original], (copy, 2 * copy), axis=(0, 1)) if copy else images[original]
            if side != 32:
                image = np.asarray(Image.fromarray(image).resize((side, side), Image.BICUBIC))
            encoded = io.BytesIO()
            Image.fromarray(image).save(encoded, format="PNG", compress_level=1)
            info = tarfile.TarInfo(f"{splits[original]}/{classes[original]}/{copy:03d}-{original:05d}.png")
            info.size = encoded.tell()
            encoded.seek(0)
            archive.addfile(info, encoded)
    temporary.rename(path)
    print(f"made {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def prepare_cost(source: Path, workers: int = 1) -> tuple[float, int, str, float]:
    """Seconds and peak bytes of prepare_data on `source` with `workers` workers, in a fresh process (its own VmHWM,
    not this one's; with workers, the largest of any one process's), its manifest's SHA-256, and the cores it kept
    busy on average (CPU time over wall time, workers included)."""
    output = subprocess.run(
        [sys.executable, "-c", PREPARE, str(source), str(WORK / f"{source.stem}-dataset-{workers}"),
         str(WORK / "scale-cache"), str(workers)],
        cwd=REPOSITORY, capture_output=True, text=True,
    )  # fmt: skip
    if output.returncode:
        sys.exit(f"prepare_data on {source} failed:\n{output.stderr[-2000:]}")
    manifest, took, peak, cores = output.stdout.split()[-4:]
    return float(took), int(peak), manifest, float(cores)


def evaluate_cost(dataset: Path) -> tuple[float, int, int]:
    """Seconds and peak bytes of the evaluate stage on `dataset`'s test split, in a fresh process, of a ResNet-20
    trained one step on it (not timed), and the images it evaluated."""
    model_dir = WORK / f"{dataset.name}-model"
    for script, arguments in (
        (TRAIN_ONE_STEP, [dataset, model_dir]),
        (EVALUATE, [dataset, model_dir, model_dir / "eval"]),
    ):
        output = subprocess.run([sys.executable, "-c", script, *map(str, arguments)], cwd=REPOSITORY,
                                capture_output=True, text=True)  # fmt: skip
        if output.returncode:
            sys.exit(f"{dataset}: the evaluate stage's run failed:\n{output.stderr[-2000:]}")
    took, peak, images = output.stdout.split()[-3:]
    shutil.rmtree(model_dir)
    return float(took), int(peak), int(images)


def features_of(size: int, images: np.ndarray) -> np.ndarray:
    """The search's descriptors of the `size` images of the scaled source, computed a chunk at a time."""
    features = np.empty((size, statistics._WEIGHTS.size), statistics.DESCRIPTOR_DTYPE)  # as prepare_data keeps them
    for start in range(0, size, 8192):
        indices = np.arange(start, min(start + 8192, size))
        copies, originals = np.divmod(indices, len(images))
        chunk = np.stack([
            np.roll(images[original], (copy, 2 * copy), axis=(0, 1)) if copy else images[original]
            for copy, original in zip(copies, originals, strict=True)
        ])  # fmt: skip
        features[start : start + len(chunk)] = statistics.descriptors(chunk.astype(np.float32))
    return features


def search_cost(features: np.ndarray, sample: int) -> tuple[float, float, int]:
    """Seconds of the search, its recall on a sample's exhaustive comparison, and the pairs that recall counts."""
    started = time.perf_counter()
    left, right, _similarity = statistics.near_duplicate_pairs(features)
    took = time.perf_counter() - started
    chosen = np.random.default_rng(0).choice(len(features), min(sample, len(features)), replace=False)
    truth, whole = set(), features.astype(np.float32)
    for start in range(0, len(chosen), 256):
        rows = chosen[start : start + 256]
        hits_row, hits_column = np.nonzero(whole[rows] @ whole.T >= statistics.NEAR_DUPLICATE_THRESHOLD)
        for row, column in zip(rows[hits_row], hits_column, strict=True):
            if row != column:
                truth.add((min(row, column), max(row, column)))
    found = set(zip(left.tolist(), right.tolist(), strict=True))
    recall = len(truth & found) / len(truth) if truth else 1.0
    return took, recall, len(truth)


def exponent(small: float, large: float, small_size: int, large_size: int) -> float:
    return math.log(large / small) / math.log(large_size / small_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="60000,600000", help="image counts, comma-separated, smallest first")
    parser.add_argument("--side", type=int, default=32, help="the images' side in pixels (not 32: the search, whose "
                        "descriptors are computed at 32x32 whatever the size, is not run)")  # fmt: skip
    parser.add_argument("--sample", type=int, default=2000, help="images whose every pair the recall is checked on")
    parser.add_argument("--workers", type=int, default=2, help="at the largest size, also prepare with this many "
                        "workers (--prepare-workers), against one (1: not)")  # fmt: skip
    parser.add_argument("--evaluate", choices=("on", "off"), default="on", help="time the evaluate stage at each size")
    arguments = parser.parse_args()
    sizes = sorted(int(size) for size in arguments.sizes.split(","))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; images {arguments.side}x{arguments.side}", flush=True)
    cifar = cifar_images()
    rows = {}
    for size in sizes:
        source = scaled_source(size, cifar, arguments.side)
        prepare_seconds, peak, manifest, cores = prepare_cost(source)
        line = (f"{size:>9,} images: prepare {prepare_seconds:7.1f} s ({prepare_seconds / size * 1e6:5.0f} us an "
                f"image), peak {peak / 2**20:6.0f} MB, {cores:.2f} cores busy")  # fmt: skip
        search_seconds = None
        if arguments.side == 32:
            search_seconds, recall, pairs = search_cost(features_of(size, cifar[0]), arguments.sample)
            line += (f"; search {search_seconds:6.2f} s, recall {recall:.3f} on {pairs:,} pairs of a "
                     f"{arguments.sample:,}-image sample")  # fmt: skip
        evaluation = None
        if arguments.evaluate == "on":
            evaluation = evaluate_cost(WORK / f"{source.stem}-dataset-1")
            line += (f"; evaluate {evaluation[2]:,} test images {evaluation[0]:6.1f} s, peak "
                     f"{evaluation[1] / 2**20:6.0f} MB")  # fmt: skip
        rows[size] = (prepare_seconds, peak, search_seconds, evaluation)
        print(line, flush=True)
    small, large = sizes[0], sizes[-1]
    if arguments.workers > 1:
        fanned_seconds, fanned_peak, fanned_manifest, fanned_cores = prepare_cost(
            scaled_source(large, cifar, arguments.side), arguments.workers
        )
        same = "the same dataset" if fanned_manifest == manifest else "ANOTHER DATASET (manifests differ)"
        print(f"{large:>9,} images, --prepare-workers {arguments.workers}: prepare {fanned_seconds:7.1f} s, "
              f"{rows[large][0] / fanned_seconds:.2f}x faster than 1 worker, peak {fanned_peak / 2**20:6.0f} MB "
              f"(the largest process's), {fanned_cores:.2f} cores busy; {same}", flush=True)  # fmt: skip
    if small == large:
        return
    (prepare_small, peak_small, search_small, evaluation_small) = rows[small]
    (prepare_large, peak_large, search_large, evaluation_large) = rows[large]
    print(f"growth from {small:,} to {large:,} images (exponent: 1 is linear, 0 constant):")
    print(f"  prepare time   {exponent(prepare_small, prepare_large, small, large):.2f}  "
          f"(time an image {prepare_large / large / (prepare_small / small):.2f}x)")  # fmt: skip
    print(f"  prepare peak   {exponent(peak_small, peak_large, small, large):.2f}  ({peak_large / peak_small:.2f}x)")
    if search_small is not None:
        print(f"  search time    {exponent(search_small, search_large, small, large):.2f}")
    if evaluation_small is not None:
        (seconds_small, held_small, images_small), (seconds_large, held_large, images_large) = (
            evaluation_small, evaluation_large)  # fmt: skip
        print(f"  evaluate time  {exponent(seconds_small, seconds_large, images_small, images_large):.2f}")
        print(f"  evaluate peak  {exponent(held_small, held_large, images_small, images_large):.2f}  "
              f"({held_large / held_small:.2f}x)")  # fmt: skip


def cpu_name() -> str:
    with open("/proc/cpuinfo") as cpuinfo:  # reader: the kernel's CPU description, a few kilobytes
        found = re.search(r"model name\s*:\s*(.*)", cpuinfo.read())
    return found.group(1) if found else "unknown CPU"


if __name__ == "__main__":
    main()
