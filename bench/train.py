"""Benchmark: the training loop against a bare tf.function step, and two local workers against one.

1. images/s of this stage's loop with its default features (input pipeline with augmentation, L2, the
   piecewise schedule, one all-reduce carrying gradients, batch-norm statistics and flags, check numerics,
   summaries and logging) on ResNet-20, batch 128, against a bare `tf.function` step (forward, loss,
   gradients, `optimizer.apply_gradients`) on the same model and a fixed batch. Target ratio >= 0.95.
2. images/s of two local worker processes against one, at the same global batch.

The loop and the bare step are timed in windows of consecutive steps after one window of warm-up (the loop's
from its own progress lines; bench/timing.py), so start-up and tracing are left out. Rounds alternate which side
goes first, so that machine noise hits both sides alike.

With `--s3` the dataset is copied to a bucket of a local S3 server (moto, on 127.0.0.1) and both sides train from its
s3:// copy, as from an object store: the train stage downloads and verifies the shards to its cache before the first
step (timed and printed on its own), so the loop reads local files whatever the dataset's size. The two-worker
comparison is then not run.

    .venv/bin/python bench/train.py [--dataset DIR] [--rounds 5] [--window-steps 20] [--windows 4] [--steps 60]
    .venv/bin/python bench/train.py --s3 --dataset bench/work/scale-600000-dataset-1 --rounds 3 --run-steps 37500
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
WORK = REPOSITORY / "bench" / "work"

from bench import timing  # noqa: E402
from components.common.config import config_to_dict  # noqa: E402
from components.train.config import TrainConfig  # noqa: E402

BATCH = 128
DEPTH = 20


def dataset_directory(given: str | None) -> str:
    if given:
        return given
    target = WORK / "dataset"
    if not (target / "manifest.json").exists():
        from components.prepare_data.config import PrepareDataConfig
        from components.prepare_data.prepare import prepare_data

        archive = WORK / "cifar-10-python.tar.gz"
        source = str(archive) if archive.exists() else "synthetic"
        logging.warning("preparing %s into %s (run bench/prepare_data.py first to use real CIFAR-10)", source, target)
        prepare_data(PrepareDataConfig(output=str(target), source=source, synthetic_train_per_class=1000))
    return str(target)


def speed_round(
    data: str, round_number: int, window_steps: int, windows: int, run_steps: int | None = None
) -> tuple[float, float]:
    """Images/s of the bare step and of this loop, each the median of its windows; odd rounds start with the bare
    step, even ones with the loop. `run_steps`: the length of the run whose cadence (summaries, checkpoints,
    validation) the loop's windows keep (None: their own short run's, which validates every few steps)."""
    import keras

    from components.common.model import ModelSpec, build_resnet

    def bare() -> list[float]:
        model, optimizer = build_resnet(ModelSpec(depth=DEPTH)), keras.optimizers.SGD(0.1, momentum=0.9)
        return timing.bare_window_seconds(model, optimizer, BATCH, window_steps, windows)

    config = TrainConfig(data=data, model_dir="unused", depth=DEPTH, batch_size=BATCH)
    bare_seconds, loop_seconds = timing.paired_round(
        round_number, bare, lambda: timing.loop_window_seconds(config, window_steps, windows, run_steps)
    )
    return BATCH / bare_seconds, BATCH / loop_seconds


def workers_images_per_second(data: str, workers: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as model_dir:
        config = TrainConfig(
            data=data,
            model_dir=model_dir,
            depth=DEPTH,
            batch_size=BATCH,
            train_steps=10 + steps,
            log_every_steps=10,
            workers=workers,
        )
        completed = subprocess.run(
            [sys.executable, "-m", "components.train", "--config", json.dumps(config_to_dict(config))],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
        )
    rates = [float(rate) for rate in re.findall(r"step \d+/\d+ .* ([\d.]+) examples/s", completed.stderr)]
    if workers > 1:  # every worker logs the same steps; take worker-0's lines
        rates = [float(r) for r in re.findall(r"\[worker-0\].*step \d+/\d+ .* ([\d.]+) examples/s", completed.stderr)]
    return statistics.median(rates[1:])  # the first window includes tracing


def served_from_s3(local: str) -> str:
    """The prepared dataset at `local` copied (its manifest last) to a bucket of an S3 server started on 127.0.0.1 for
    this run, and its s3:// URI; the standard AWS variables point this process at the server, and the cache it is
    downloaded to is a scratch folder. Prints how long the train stage takes to download and verify it."""
    import socket
    import time

    from moto.server import ThreadedMotoServer

    from components.common import object_stores
    from components.common.dataset import open_dataset

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()  # a daemon thread: ends with the run
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's line for every request
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", XDG_CACHE_HOME=cache)  # fmt: skip
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        os.environ.pop(variable, None)
    object_stores.reset_clients()
    client = object_stores.s3_client()
    client.create_bucket(Bucket="bench")
    files = sorted(
        (path for path in Path(local).rglob("*") if path.is_file()), key=lambda path: path.name == "manifest.json"
    )
    started = time.perf_counter()
    for path in files:
        client.upload_file(str(path), "bench", f"dataset/{path.relative_to(local).as_posix()}")
    size = sum(path.stat().st_size for path in files)
    took = time.perf_counter() - started
    print(f"copied {len(files)} files ({size / 1e9:.2f} GB) to s3://bench/dataset in {took:.0f} s", flush=True)
    started = time.perf_counter()
    open_dataset("s3://bench/dataset")
    print(f"the train stage's download and check of its shards: {time.perf_counter() - started:.0f} s (cached after)",
          flush=True)  # fmt: skip
    return "s3://bench/dataset"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", help="a prepared dataset (default: bench/work/dataset, prepared if missing)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="steps per worker-count run")
    parser.add_argument("--window-steps", type=int, default=20, help="steps per timed window of the loop comparison")
    parser.add_argument("--windows", type=int, default=4, help="timed windows per side and round")
    parser.add_argument("--s3", action="store_true", help="train from the dataset's copy on a local S3 server")
    parser.add_argument("--run-steps", type=int, help="keep the cadence of a run this long in the timed windows "
                        "(default: the windows' own short run, which validates every few steps: at 600,000 images "
                        "a pass over 100,000 in every window)")  # fmt: skip
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    data = dataset_directory(arguments.dataset)
    if arguments.s3:
        data = served_from_s3(data)

    bare_rates, loop_rates = [], []
    for round_number in range(1, arguments.rounds + 1):
        bare, loop = speed_round(data, round_number, arguments.window_steps, arguments.windows, arguments.run_steps)
        bare_rates.append(bare)
        loop_rates.append(loop)
        print(f"round {round_number}: bare step {bare:.0f} images/s, this loop {loop:.0f} images/s", flush=True)
    paired = statistics.median(loop / bare for bare, loop in zip(bare_rates, loop_rates, strict=True))
    print(f"ResNet-{DEPTH}, batch {BATCH}, {arguments.windows} windows of {arguments.window_steps} steps a side, "
          f"median of {arguments.rounds} rounds")  # fmt: skip
    print(f"bare tf.function step:           {statistics.median(bare_rates):7.0f} images/s")
    print(f"this loop (default features):    {statistics.median(loop_rates):7.0f} images/s")
    print(f"ratio loop / bare: {paired:.2f} (median of per-round ratios; target >= 0.95)")
    if arguments.s3:
        return

    one, two = [], []
    for _round in range(arguments.rounds):
        one.append(workers_images_per_second(data, 1, arguments.steps))
        two.append(workers_images_per_second(data, 2, arguments.steps))
    one_rate, two_rate = statistics.median(one), statistics.median(two)
    print(f"one worker:        {one_rate:7.0f} images/s")
    print(f"two local workers: {two_rate:7.0f} images/s (same global batch {BATCH}, {os.cpu_count()} cores)")
    paired = statistics.median(t / o for o, t in zip(one, two, strict=True))
    print(f"ratio two / one: {paired:.2f} (median of per-round ratios)")


if __name__ == "__main__":
    main()
