"""Benchmark: what each training preset buys on real CIFAR-10, accuracy against time, in one process run.

1. Accuracy: for each preset (default: fast, then estimator), `--runs` trainings of `--epochs` epochs on all 50,000
   training images (prepared once with no validation hold-out), each evaluated on the 10,000 test images by the
   evaluate stage (with the test-time augmentation the model was trained for). Reports every run, the mean and
   spread of the accuracy, the wall time and the training images/s.
2. Speed: images/s of the fast preset's training loop against a bare `tf.function` step of the same network,
   batch and optimizer on a fixed batch (target ratio >= 0.95), rounds alternating.

    .venv/bin/python bench/accuracy.py [--runs 2] [--epochs 10] [--presets fast estimator] [--speed-rounds 5]

The real images come from ../shared/data through bench/prepare_data.py's archive (bench/work/).
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
from bench.prepare_data import official_archive  # noqa: E402

RATE = re.compile(r"step \d+/\d+ .* ([\d.]+) examples/s")


def full_training_set() -> str:
    """All 50,000 training images and the 10,000 test images, as the published recipes train and test."""
    target = WORK / "dataset-all-training-images"
    if not (target / "manifest.json").exists():
        archive = official_archive(None)
        run([sys.executable, "-m", "components.prepare_data", "--source", str(archive), "--output", str(target),
             "--validation-fraction", "0"])  # fmt: skip
    return str(target)


def run(command: list[str]) -> str:
    """Run a stage, echoing its progress lines (step, examples/s, ETA; accuracy); returns its whole log."""
    process = subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if RATE.search(line) or ("accuracy" in line and "evaluate" in line):
            print("    " + line.rstrip().split(" INFO ", 1)[-1], flush=True)
    if process.wait() != 0:
        sys.exit(f"{' '.join(command[:4])} failed:\n{''.join(lines)[-3000:]}")
    return "".join(lines)


def train_and_evaluate(data: str, preset: str, epochs: float, seed: int, model_dir: Path) -> dict:
    started = time.monotonic()
    trained = run([sys.executable, "-m", "components.train", "--data", data, "--model-dir", str(model_dir),
                   "--preset", preset, "--epochs", str(epochs), "--seed", str(seed), "--log-every-steps", "20",
                   "--checkpoint-every-seconds", "3600"])  # fmt: skip
    seconds = time.monotonic() - started
    rates = [float(rate) for rate in RATE.findall(trained)][1:]  # the first window includes tracing
    run([sys.executable, "-m", "components.evaluate", "--data", data, "--model-dir", str(model_dir)])
    evaluation = json.loads((model_dir / "eval_metrics.json").read_text())
    return {
        "preset": preset,
        "seed": seed,
        "epochs": epochs,
        "accuracy": evaluation["metrics"]["accuracy"],
        "train_seconds": round(seconds),
        "images_per_second": round(statistics.median(rates)) if rates else None,
    }


def loop_seconds_per_step(data: str, steps: int) -> float:
    from components.common.config import config_from_mapping
    from components.train.config import TrainConfig
    from components.train.loop import Trainer

    def timed(count: int) -> float:
        with tempfile.TemporaryDirectory() as model_dir:
            values = {"data": data, "model_dir": model_dir, "preset": "fast", "train_steps": count,
                      "log_every_steps": 5}  # fmt: skip
            trainer = Trainer(config_from_mapping(TrainConfig, values, "benchmark"))
            try:
                start = time.perf_counter()
                trainer.run()
                return time.perf_counter() - start
            finally:
                trainer.close()

    return (timed(3 + steps) - timed(3)) / steps


def bare_seconds_per_step(batch: int, steps: int) -> float:
    import keras

    from components.train.model import ModelSpec, build_model

    model = build_model("airbench", ModelSpec(batch_norm_decay=0.6, batch_norm_epsilon=1e-12))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.85, nesterov=True)
    return bare_step.bare_seconds_per_step(model, optimizer, batch, steps, warmup_steps=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--presets", nargs="+", default=["fast", "estimator"], choices=["fast", "estimator"])
    parser.add_argument("--speed-rounds", type=int, default=5, help="0 skips the speed comparison")
    parser.add_argument("--speed-steps", type=int, default=8)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    data = full_training_set()

    results = []
    for preset in arguments.presets:
        for seed in range(1, arguments.runs + 1):
            with tempfile.TemporaryDirectory(dir=WORK) as model_dir:
                results.append(train_and_evaluate(data, preset, arguments.epochs, seed, Path(model_dir)))
            print(json.dumps(results[-1]), flush=True)
    print(f"\n{arguments.epochs:g} epochs on all 50,000 training images, tested on the 10,000 test images, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print("| preset | runs | test accuracy (mean +- std) | train time (mean) | training images/s |")
    print("|---|---|---|---|---|")
    for preset in arguments.presets:
        mine = [result for result in results if result["preset"] == preset]
        accuracies = [result["accuracy"] for result in mine]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        seconds = statistics.mean(result["train_seconds"] for result in mine)
        rates = [result["images_per_second"] for result in mine if result["images_per_second"]]
        print(f"| {preset} | {len(mine)} | {100 * statistics.mean(accuracies):.2f}% +- {100 * spread:.2f} "
              f"| {seconds / 60:.1f} min | {statistics.median(rates) if rates else 0:.0f} |")  # fmt: skip

    if arguments.speed_rounds:
        batch = 1024
        loop_times, bare_times = [], []
        for round_number in range(1, arguments.speed_rounds + 1):
            bare_times.append(bare_seconds_per_step(batch, arguments.speed_steps))
            loop_times.append(loop_seconds_per_step(data, arguments.speed_steps))
            print(f"round {round_number}: bare step {batch / bare_times[-1]:.0f} images/s, "
                  f"the fast preset's loop {batch / loop_times[-1]:.0f} images/s", flush=True)  # fmt: skip
        paired = statistics.median(b / o for b, o in zip(bare_times, loop_times, strict=True))
        print(f"ratio fast loop / bare step: {paired:.2f} (median of per-round ratios; target >= 0.95)")


if __name__ == "__main__":
    main()
