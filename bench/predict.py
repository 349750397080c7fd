"""Benchmark: batch prediction against a bare batched call of the same SavedModel, and its memory.

Scores a prepared synthetic dataset of `--images` images (made once in bench/work/) with the promoted model under
`--model` (default outputs/models: run `make local-run` first), twice per round in turns: the predict stage (reading
the shards, batching, writing JSON Lines) and a bare loop calling the SavedModel's serving signature on the same
images already in memory, same batch size (with `--in-turn`, also the stage reading in turn with the model's calls
instead of on a thread ahead of them). Prints the medians, their ratio, and the predict stage's peak memory (it runs
in a process of its own) for two input sizes: memory that stays flat as the input grows is bounded.

    .venv/bin/python bench/predict.py [--model outputs/models] [--images 20000] [--rounds 3] [--in-turn]
    .venv/bin/python bench/predict.py --scale 1000000    # only the stage, at --images and at 1,000,000 images

With `--scale N`, the stage alone runs at `--images` and at N images (its dataset made once, about 3 GB at a
million), and the growth of its time an image and of its peak memory is printed: flat memory and linear time.
"""

from __future__ import annotations

import argparse
import json
import os
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

MEASURE = """
import json, re, sys, time  # the peak: VmHWM, which starts again at exec (ru_maxrss keeps the parent's)
sys.path.insert(0, {repository!r})
from components.predict.config import PredictConfig
from components.predict.predict import predict
{prelude}
started = time.perf_counter()
summary = predict(PredictConfig(model={model!r}, images={images!r}, output={output!r}, batch_size={batch}))
print(json.dumps({{"seconds": time.perf_counter() - started, "scored": summary["scored"],
                  "scoring_seconds": summary["this_run"]["seconds"],
                  "peak_mb": int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024}}))
"""


def dataset(count: int) -> str:
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    output = WORK / f"predict-{count}"
    per_class = count // 10
    prepare_data(PrepareDataConfig(output=str(output), source="synthetic", synthetic_train_per_class=1,
                                   synthetic_eval_per_class=per_class, validation_fraction=0.0))  # fmt: skip
    return str(output)


# The stage with its reading done in turn with the model's calls, not on a thread of its own ahead of them.
IN_TURN = "import components.predict.predict as stage; stage.ahead = lambda pieces, depth=2: iter(pieces)"


def staged(model: str, images: str, batch: int, read_ahead: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        prelude = "" if read_ahead else IN_TURN
        program = MEASURE.format(repository=str(REPOSITORY), model=model, images=images, batch=batch,
                                 output=f"{folder}/predictions.jsonl", prelude=prelude)  # fmt: skip
        completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def bare(model: str, images: str, batch: int) -> float:
    import numpy as np
    import tensorflow as tf

    from components.common.dataset import open_dataset
    from components.evaluate.pointer import read_ready

    loaded = tf.saved_model.load(read_ready(model)["saved_model"])
    serve = loaded.signatures["serving_default"]
    pixels = np.concatenate([batch_images.numpy() for batch_images, _ in open_dataset(images).tf_dataset("eval", 4096)])
    started = time.perf_counter()
    for start in range(0, len(pixels), batch):
        serve(images=tf.constant(pixels[start : start + batch]))["probabilities"].numpy()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPOSITORY / "outputs" / "models"))
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-turn", action="store_true", help="also time the stage reading in turn, not ahead")
    parser.add_argument("--scale", type=int, default=0, help="only the stage, at --images and at this many images")
    arguments = parser.parse_args()
    if not Path(arguments.model, "current.json").exists():
        sys.exit(f"{arguments.model}: no promoted model; run make local-run first, or give --model")
    if arguments.scale:
        measured = {count: staged(arguments.model, dataset(count), arguments.batch_size)
                    for count in (arguments.images, arguments.scale)}  # fmt: skip
        for count, result in measured.items():
            print(f"{count:>9,} images: {result['seconds']:7.1f} s, {result['seconds'] / count * 1e6:5.0f} us an "
                  f"image, peak {result['peak_mb']:6.0f} MB", flush=True)  # fmt: skip
        (small, first), (large, last) = measured.items()
        growth = last["seconds"] / large / (first["seconds"] / small)
        print(f"from {small:,} to {large:,} images: time an image {growth:.2f}x, "
              f"peak memory {last['peak_mb'] / first['peak_mb']:.2f}x (target 1.1x)")  # fmt: skip
        return
    small, large = dataset(arguments.images // 4), dataset(arguments.images)
    staged_times, scoring_times, bare_times, in_turn_times = [], [], [], []
    for number in range(arguments.rounds):
        measured = staged(arguments.model, large, arguments.batch_size)
        staged_times.append(measured["seconds"])
        scoring_times.append(measured["scoring_seconds"])
        bare_times.append(bare(arguments.model, large, arguments.batch_size))
        if arguments.in_turn:
            in_turn_times.append(staged(arguments.model, large, arguments.batch_size, False)["scoring_seconds"])
        in_turn = f", scoring in turn {in_turn_times[-1]:.2f} s" if in_turn_times else ""
        print(f"round {number + 1}: predict {staged_times[-1]:.2f} s (scoring {scoring_times[-1]:.2f} s), "
              f"bare {bare_times[-1]:.2f} s{in_turn}", flush=True)  # fmt: skip
    peaks = {count: staged(arguments.model, path, arguments.batch_size)["peak_mb"]
             for count, path in ((arguments.images // 4, small), (arguments.images, large))}  # fmt: skip
    stage, baseline = statistics.median(staged_times), statistics.median(bare_times)
    scoring = statistics.median(scoring_times)
    print(f"predict stage, scoring: {arguments.images / scoring:,.0f} images/s (reading shards, writing JSON Lines)")
    print(f"predict stage, whole job: {stage:.2f} s (with loading the model, listing the images, the report)")
    print(f"bare batched call: {arguments.images / baseline:,.0f} images/s (images already in memory)")
    print(f"ratio predict scoring / bare (speed): {baseline / scoring:.2f}; whole job / bare: {baseline / stage:.2f}")
    if in_turn_times:
        in_turn = statistics.median(in_turn_times)
        print(f"reading ahead on a thread: {arguments.images / scoring:,.0f} images/s; in turn with the calls: "
              f"{arguments.images / in_turn:,.0f} images/s ({in_turn / scoring:.2f}x the time)")  # fmt: skip
    print(
        "peak memory of the predict stage: "
        + ", ".join(f"{count:,} images {mb:,.0f} MB" for count, mb in peaks.items())
    )


if __name__ == "__main__":
    main()
