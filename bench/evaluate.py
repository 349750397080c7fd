"""Benchmark: the evaluate stage's images/s against a bare batched model call on the same model, in one run.

The stage's pass (`Evaluator.probabilities`: batches of uint8 images -> normalized -> model -> softmax ->
numpy, with progress reporting) is timed against a bare `tf.function` calling the model on the same
batches already on the device as float32. Rounds alternate; medians and their ratio are printed
(target >= 0.9).

    .venv/bin/python bench/evaluate.py [--dataset DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import tensorflow as tf  # noqa: E402

from components.evaluate.config import EvaluateConfig  # noqa: E402
from components.evaluate.evaluate import Evaluator  # noqa: E402
from components.train.config import TrainConfig  # noqa: E402
from components.train.loop import train  # noqa: E402

DEPTH = 20
BATCH = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(REPOSITORY / "bench" / "work" / "dataset"))
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory() as model_dir:
        train(TrainConfig(data=arguments.dataset, model_dir=model_dir, depth=DEPTH, train_steps=1, log_every_steps=1))
        evaluator = Evaluator(EvaluateConfig(data=arguments.dataset, model_dir=model_dir, batch_size=BATCH))
        evaluator.evaluate_checkpoint(str(Path(model_dir) / "ckpt-1"))  # restores weights, warms up
        images = len(evaluator.labels)
        batches = [tf.constant(evaluator.images[start : start + BATCH]) for start in range(0, images, BATCH)]
        bare_call = tf.function(lambda batch: evaluator.model(batch, training=False))
        for batch in batches[:2]:
            bare_call(batch)

        def bare() -> float:
            start = time.perf_counter()
            for batch in batches:
                result = bare_call(batch)
            result.numpy()
            return time.perf_counter() - start

        def stage() -> float:
            start = time.perf_counter()
            evaluator.probabilities()
            return time.perf_counter() - start

        bare_times, stage_times = [], []
        for round_number in range(1, arguments.rounds + 1):
            bare_times.append(bare())
            stage_times.append(stage())
            bare_rate, stage_rate = images / bare_times[-1], images / stage_times[-1]
            print(f"round {round_number}: bare {bare_rate:.0f} images/s, stage {stage_rate:.0f} images/s")
    bare_rate, stage_rate = images / statistics.median(bare_times), images / statistics.median(stage_times)
    print(f"ResNet-{DEPTH}, {images} images, batch {BATCH}, median of {arguments.rounds} rounds")
    print(f"bare batched model call: {bare_rate:7.0f} images/s")
    print(f"evaluate stage:          {stage_rate:7.0f} images/s")
    paired = statistics.median(b / s for b, s in zip(bare_times, stage_times, strict=True))
    print(f"ratio stage / bare: {paired:.2f} (median of per-round ratios; target >= 0.9)")


if __name__ == "__main__":
    main()
