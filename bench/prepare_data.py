"""Benchmark: prepare_data on all 60,000 CIFAR-10 images against the estimator example's converter, in one run.

The baseline is the TF1 CIFAR-10 estimator example's `generate_cifar10_tfrecords.py`: `tarfile.extractall`,
unpickle each batch, one `tf.train.Example` built and serialized per image in a Python loop, one file
per split. This stage additionally validates every batch, transposes to HWC, shuffles, shards, and
checksums every shard. Rounds alternate between the two so that machine noise hits both alike; the
medians and their ratio are printed (target: ratio <= 1.0).

    .venv/bin/python bench/prepare_data.py [--archive cifar-10-python.tar.gz] [--rounds 3]

Without --archive, the archive is built once from ../shared/data/cifar10-jpeg.tar.gz with
../shared/tools/cifar_python_from_jpeg.py and kept in bench/work/.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from components.common.memory import reuse_freed_memory  # noqa: E402
from components.prepare_data.config import PrepareDataConfig  # noqa: E402
from components.prepare_data.prepare import prepare_data  # noqa: E402

SHARED = REPOSITORY.parent / "shared"
WORK = REPOSITORY / "bench" / "work"


def official_archive(given: str | None) -> Path:
    if given:
        return Path(given)
    archive = WORK / "cifar-10-python.tar.gz"
    if not archive.exists():
        jpegs = SHARED / "data" / "cifar10-jpeg.tar.gz"
        if not jpegs.exists():
            sys.exit(f"{jpegs} not found: pass --archive PATH to an official-layout CIFAR-10 python archive")
        WORK.mkdir(parents=True, exist_ok=True)
        logging.info("building %s from %s (about 30 s)", archive, jpegs)
        subprocess.run(
            [sys.executable, str(SHARED / "tools" / "cifar_python_from_jpeg.py"), str(jpegs), str(archive)], check=True
        )
    return archive


def example_converter(archive: Path, work: Path) -> None:
    """The estimator example's converter, as it was (TF2 spellings of the same calls)."""
    import tensorflow as tf

    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(work)  # the example extracted without any filter
    input_dir = work / "cifar-10-batches-py"
    file_names = {
        "train": [f"data_batch_{index}" for index in range(1, 5)],
        "validation": ["data_batch_5"],
        "eval": ["test_batch"],
    }
    for mode, files in file_names.items():
        with tf.io.TFRecordWriter(str(work / f"{mode}.tfrecords")) as record_writer:
            for input_file in files:
                with open(input_dir / input_file, "rb") as handle:
                    data_dict = pickle.load(handle, encoding="bytes")
                data, labels = data_dict[b"data"], data_dict[b"labels"]
                for index in range(len(labels)):
                    example = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data[index].tobytes()])),
                                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[index]])),
                            }
                        )
                    )
                    record_writer.write(example.SerializeToString())


def this_stage(archive: Path, work: Path, force: bool = True) -> None:
    result = prepare_data(PrepareDataConfig(output=str(work / "dataset"), source=str(archive), force=force))
    assert sum(split.num_examples for split in result.manifest.splits.values()) == 60000


def timed(function, *arguments) -> float:
    start = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", help="an official-layout CIFAR-10 python archive")
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    archive = official_archive(arguments.archive)
    # The stage's entry point tunes malloc (components/common/memory.py); the example gets the same process.
    print(f"malloc keeps freed memory for reuse (both converters): {reuse_freed_memory()}")
    import tensorflow as tf  # imported before timing, for both

    tf.constant(0)
    example_times, stage_times, rerun_times = [], [], []
    for _round in range(arguments.rounds):
        with tempfile.TemporaryDirectory(dir=WORK if WORK.exists() else None) as example_work:
            example_times.append(timed(example_converter, archive, Path(example_work)))
        with tempfile.TemporaryDirectory(dir=WORK if WORK.exists() else None) as stage_work:
            stage_times.append(timed(this_stage, archive, Path(stage_work)))
            rerun_times.append(timed(this_stage, archive, Path(stage_work), False))
        print(f"round {_round + 1}: example {example_times[-1]:.2f} s, this stage {stage_times[-1]:.2f} s", flush=True)
    example, stage, rerun = (statistics.median(times) for times in (example_times, stage_times, rerun_times))
    print(f"images: 60000 ({archive})")
    print(f"estimator example (extractall, Example per image):  {example:6.2f} s  ({60000 / example:,.0f} images/s)")
    print(f"prepare_data (validate, shard, checksum, publish): {stage:6.2f} s  ({60000 / stage:,.0f} images/s)")
    print(f"prepare_data rerun with nothing to do:             {rerun:6.2f} s")
    paired = statistics.median(o / s for s, o in zip(example_times, stage_times, strict=True))
    print(f"ratio prepare_data / estimator example: {paired:.2f} (median of per-round ratios; target <= 1.0)")
    shutil.rmtree(WORK / "tmp", ignore_errors=True)


if __name__ == "__main__":
    main()
