"""Benchmark: the training loop against a bare tf.function step, and two local workers against one.

1. images/s of this stage's loop with its default features (input pipeline with augmentation, L2, the
   piecewise schedule, one all-reduce carrying gradients, batch-norm statistics and flags, check numerics,
   summaries and logging) on ResNet-20, batch 128, against a bare `tf.function` step (forward, loss,
   gradients, `optimizer.apply_gradients`) on the same model and a fixed batch. Target ratio >= 0.95.
2. images/s of two local worker processes against one, at the same global batch.

Per-step time is measured as the difference between a long and a short run, so start-up and tracing
cancel out. Rounds alternate so that machine noise hits both sides alike.

    .venv/bin/python bench/train.py [--dataset DIR] [--rounds 2] [--steps 60]
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
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
WORK = REPOSITORY / "bench" / "work"

from bench import bare_step  # noqa: E402
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


def loop_seconds_per_step(data: str, steps: int) -> float:
    from components.train.loop import Trainer

    def run(count: int) -> float:
        with tempfile.TemporaryDirectory() as model_dir:
            config = TrainConfig(
                data=data, model_dir=model_dir, depth=DEPTH, batch_size=BATCH, train_steps=count, log_every_steps=10
            )
            trainer = Trainer(config)
            try:
                start = time.perf_counter()
                trainer.run()
                return time.perf_counter() - start
            finally:
                trainer.close()

    short, long = run(10), run(10 + steps)
    return (long - short) / steps


def bare_seconds_per_step(steps: int) -> float:
    import keras

    from components.train.model import ModelSpec, build_resnet

    model = build_resnet(ModelSpec(depth=DEPTH))
    return bare_step.bare_seconds_per_step(model, keras.optimizers.SGD(0.1, momentum=0.9), BATCH, steps, 10)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", help="a prepared dataset (default: bench/work/dataset, prepared if missing)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    data = dataset_directory(arguments.dataset)

    loop_times, bare_times = [], []
    for round_number in range(1, arguments.rounds + 1):
        bare_times.append(bare_seconds_per_step(arguments.steps))
        loop_times.append(loop_seconds_per_step(data, arguments.steps))
        print(
            f"round {round_number}: bare step {BATCH / bare_times[-1]:.0f} images/s, "
            f"this loop {BATCH / loop_times[-1]:.0f} images/s",
            flush=True,
        )
    bare, ours = BATCH / statistics.median(bare_times), BATCH / statistics.median(loop_times)
    paired = statistics.median(b / o for b, o in zip(bare_times, loop_times, strict=True))  # per-round speed ratios
    print(f"ResNet-{DEPTH}, batch {BATCH}, {arguments.steps} timed steps, median of {arguments.rounds} rounds")
    print(f"bare tf.function step:           {bare:7.0f} images/s")
    print(f"this loop (default features):    {ours:7.0f} images/s")
    print(f"ratio loop / bare: {paired:.2f} (median of per-round ratios; target >= 0.95)")

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
