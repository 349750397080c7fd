"""Benchmark: what each training preset buys on real CIFAR-10, accuracy against time, in one process run.

1. Accuracy: for each preset (default: cifar10_speedrun, then airbench94_muon, side by side), `--runs` trainings of its
   own length (or `--epochs`) on all 50,000 training images (prepared once with no validation hold-out), each
   evaluated on the 10,000 test images by the evaluate stage (with the test-time augmentation the model was trained
   for). Reports every run, the mean and spread of the accuracy, the training minutes and images/s, and the training
   FLOP/s (3 x the network's forward FLOPs per image x images/s).
2. Side by side: each preset's training loop timed in turns in this process, and the minutes its whole length
   takes at that rate (the wall-time comparison that holds when the runs of 1. finished on different days), with
   its training FLOP/s against this CPU's peak in the preset's precision, measured between the timed windows
   (bench/flops.py).
3. The PyTorch reference (`--reference-runs N`): airbench94_muon.py as published, on the same images and this CPU
   (bench/reference.py, in bench/work/reference-venv: `make bench-reference-setup`), its runs alternating with the
   project's (seed 1 of each, then seed 2, ...). Prints each side's training seconds (the project's: its epochs at
   the median rate of its progress windows after the first; the reference's: its own timer's training epochs, after
   a warm-up that compiles) and the ratio of the project's time to the reference's, with both accuracies: the
   project's time to the reference's accuracy when its accuracy is at least the reference's (goal: <= 0.7).
4. Speed: images/s of a preset's training loop (`--speed-preset`, default fast; one worker, steady state: the
   median of its own progress windows after the first) against a bare `tf.function` step of the same network,
   batch and optimizer (Muon on the kernels for a Muon recipe) on a fixed batch, timed in windows of the same
   length (target ratio >= 0.95); rounds alternate which side goes first.

    .venv/bin/python bench/accuracy.py [--runs 2] [--epochs 10] [--presets airbench94 airbench94_muon]
        [--speed-rounds 4] [--reference-runs 2 --reference-precision bfloat16]
        [--train-args "--width-multiplier 1.5"]

`--runs 0` measures only the speed; `--speed-rounds 0` only the accuracy. Runs alternate between the presets
(seed 1 of each, then seed 2 of each, ...), so an interrupted benchmark still compares them side by side. Each
finished run is appended to a results file (printed at the start); `--results FILE` continues an interrupted
benchmark: runs already in FILE (same preset, options and seed) are read back instead of trained again.

The real images come from ../shared/data through bench/prepare_data.py's archive (bench/work/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shlex
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
TRAIN_EXAMPLES = 50_000

from bench import flops, timing  # noqa: E402
from bench.prepare_data import official_archive  # noqa: E402
from components.train.presets import PRESETS  # noqa: E402


def full_training_set() -> str:
    """All 50,000 training images and the 10,000 test images, as the published recipes train and test."""
    target = WORK / "dataset-all-training-images"
    if not (target / "manifest.json").exists():
        archive = official_archive(None)
        run([sys.executable, "-m", "components.prepare_data", "--source", str(archive), "--output", str(target),
             "--validation-fraction", "0"])  # fmt: skip
    return str(target)


def stage_progress(line: str) -> str | None:
    """A stage's progress line (step, examples/s, ETA; accuracy) as it is echoed, or None."""
    if timing.RATE.search(line) or ("accuracy" in line and "evaluate" in line):
        return line.rstrip().split(" INFO ", 1)[-1]
    return None


def run(command: list[str], progress=stage_progress) -> str:
    """Run a command, echoing the lines `progress` picks (as it gives them); returns its whole log."""
    process = subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        shown = progress(line)
        if shown is not None:
            print("    " + shown, flush=True)
    if process.wait() != 0:
        sys.exit(f"{' '.join(command[:4])} failed:\n{''.join(lines)[-3000:]}")
    return "".join(lines)


def train_and_evaluate(
    data: str, preset: str, epochs: float | None, seed: int, model_dir: Path, train_arguments: list[str]
) -> dict:
    length = ["--epochs", str(epochs)] if epochs else []
    started = time.monotonic()
    trained = run([sys.executable, "-m", "components.train", "--data", data, "--model-dir", str(model_dir),
                   "--preset", preset, *length, "--seed", str(seed), "--log-every-steps", "20",
                   "--checkpoint-every-seconds", "3600", *train_arguments])  # fmt: skip
    seconds = time.monotonic() - started
    rates = [float(rate) for rate in timing.RATE.findall(trained)][1:]  # the first window includes tracing
    run([sys.executable, "-m", "components.evaluate", "--data", data, "--model-dir", str(model_dir)])
    evaluation = json.loads((model_dir / "eval_metrics.json").read_text())
    config = json.loads((model_dir / "config.json").read_text())
    resolved = config["resolved"]
    return {
        "preset": " ".join([preset, *train_arguments]),
        "seed": seed,
        "epochs": round(resolved["total_steps"] * config["batch_size"] / resolved["train_examples"], 2),
        "forward_flops": model_forward_flops(config),
        "accuracy": evaluation["metrics"]["accuracy"],
        "train_seconds": round(seconds),
        "images_per_second": round(statistics.median(rates)) if rates else None,
    }


REFERENCE_PYTHON = WORK / "reference-venv" / "bin" / "python"


def reference_run(seed: int, precision: str) -> dict:
    """One run of the published PyTorch airbench94_muon.py on this CPU (bench/reference.py), its JSON line."""
    if not REFERENCE_PYTHON.exists():
        sys.exit(f"{REFERENCE_PYTHON}: no Python with PyTorch for the reference; run make bench-reference-setup")
    command = [str(REFERENCE_PYTHON), str(REPOSITORY / "bench" / "reference.py"), "--runs", "1",
               "--first-seed", str(seed), "--precision", precision]  # fmt: skip

    def epoch_line(line: str) -> str | None:  # the script's table rows of an epoch
        return "reference: " + line.rstrip() if line.startswith("|") and line.split("|")[2].strip().isdigit() else None

    return json.loads(run(command, epoch_line).splitlines()[-1])


def reference_key(seed: int, precision: str) -> dict:
    return {"preset": f"reference airbench94_muon.py (PyTorch, {precision})", "epochs_asked": None, "seed": seed}


def print_reference_ratio(results: list[dict], project: str) -> None:
    """The project's training time against the reference's, and both accuracies."""
    mine = [result for result in results if result["preset"] == project and result.get("images_per_second")]
    theirs = [result for result in results if result["preset"].startswith("reference ")]
    if not mine or not theirs:
        return
    my_seconds = statistics.mean(result["epochs"] * TRAIN_EXAMPLES / result["images_per_second"] for result in mine)
    their_seconds = statistics.mean(result["reference_train_seconds"] for result in theirs)
    my_accuracy = statistics.mean(result["accuracy"] for result in mine)
    their_accuracy = statistics.mean(result["accuracy"] for result in theirs)
    print(f"\nAgainst the PyTorch reference on this CPU ({theirs[0]['preset']}, {len(theirs)} run(s)):")
    print(f"  {project}: {my_accuracy:.2%} in {mine[0]['epochs']:g} epochs, training {my_seconds / 60:.1f} min "
          f"(its epochs at the median rate of its progress windows)")  # fmt: skip
    print(f"  reference: {their_accuracy:.2%} in {theirs[0]['epochs']:g} epochs, training {their_seconds / 60:.1f} min "
          f"(its own timer, after a compiling warm-up)")  # fmt: skip
    reached = "to the reference's accuracy" if my_accuracy >= their_accuracy else "(NOT to the reference's accuracy)"
    print(f"  ratio of training time {reached}: {my_seconds / their_seconds:.2f} (goal <= 0.7)")


def run_key(preset: str, epochs: float | None, seed: int, train_arguments: list[str]) -> dict:
    """What identifies a run in a results file: the preset with its extra options, the length asked for, the seed."""
    return {"preset": " ".join([preset, *train_arguments]), "epochs_asked": epochs, "seed": seed}


def finished_runs(results_file: Path) -> list[dict]:
    """The runs a results file holds (one JSON object per line), in the order they finished."""
    if not results_file.exists():
        return []
    return [json.loads(line) for line in results_file.read_text().splitlines() if line.strip()]


def model_forward_flops(train_config: dict) -> int:
    """Forward FLOPs per image of the network a model directory's config.json describes."""
    from components.common.model import build_model, model_spec_of

    spec = model_spec_of(train_config)
    return flops.forward_flops(build_model(spec), spec.image_shape)


def speed_round(data: str, preset: str, round_number: int, window_steps: int, windows: int) -> tuple[float, float]:
    """Images/s of the bare step and of `preset`'s loop (one worker, as the bare step runs), each the median of its
    windows; odd rounds start with the bare step, even ones with the loop. The bare step has the preset's network,
    batch and optimizer (Muon on the kernels for a Muon recipe), without the loop's features."""
    import keras

    from components.common.config import config_from_mapping
    from components.common.model import build_model
    from components.train.config import TrainConfig

    settings = {"data": data, "model_dir": "unused", "preset": preset}
    config = config_from_mapping(TrainConfig, settings, "benchmark")
    if config.optimizer not in ("sgd", "muon"):
        raise ValueError(f"--speed-preset: {preset!r} trains with {config.optimizer}; the bare step has sgd or muon")

    def bare() -> list[float]:
        model = build_model(config_model_spec(config))
        if config.optimizer == "muon":
            optimizer = timing.BareMuon(model.trainable_variables, config, learning_rate=0.1)
        else:
            optimizer = keras.optimizers.SGD(0.1, momentum=config.momentum, nesterov=config.nesterov)
        variables = timing.steady_variables(model, config)
        return timing.bare_window_seconds(model, optimizer, config.batch_size, window_steps, windows, True, variables)

    warm_up = steady_state_steps(config)
    bare_seconds, loop_seconds = timing.paired_round(
        round_number, bare, lambda: timing.loop_window_seconds(config, window_steps, windows, warm_up_steps=warm_up)
    )
    return config.batch_size / bare_seconds, config.batch_size / loop_seconds


def print_accuracy_table(results: list[dict]) -> None:
    print(f"\nAll 50,000 training images, tested on the 10,000 test images, {os.cpu_count()} cores")
    finished = sorted(result["finished"] for result in results if "finished" in result)
    if finished and finished[0][:10] != finished[-1][:10]:
        print(f"Runs finished from {finished[0]} to {finished[-1]}: minutes of different days compare only as far "
              f"as the machine stayed the same")  # fmt: skip
    print("| preset | epochs | runs | test accuracy (mean +- std) | train time (mean) | training images/s "
          "| training GFLOP/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for preset in dict.fromkeys(result["preset"] for result in results):
        mine = [result for result in results if result["preset"] == preset]
        accuracies = [result["accuracy"] for result in mine]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        seconds = statistics.mean(result["train_seconds"] for result in mine)
        rates = [result["images_per_second"] for result in mine if result["images_per_second"]]
        rate = statistics.median(rates) if rates else 0
        achieved = f"{3 * mine[0]['forward_flops'] * rate / 1e9:.0f}" if mine[0]["forward_flops"] else "-"
        print(f"| {preset} | {mine[0]['epochs']:g} | {len(mine)} | {100 * statistics.mean(accuracies):.2f}% "
              f"+- {100 * spread:.2f} | {seconds / 60:.1f} min | {rate:.0f} | {achieved} |")  # fmt: skip


def preset_config(data: str, preset: str, epochs: float | None, train_arguments: list[str]):
    """The TrainConfig a run of `preset` (with the benchmark's length and extra options) trains with."""
    from components.common.config import parse_configs
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig

    length = ["--epochs", str(epochs)] if epochs else []
    argv = ["--data", data, "--model-dir", "unused", "--preset", preset, *length, *train_arguments]
    (config, _), _ = parse_configs((TrainConfig, LaunchConfig), argv, "benchmark")
    return config


def config_model_spec(config):
    """The network a TrainConfig trains on its dataset's images."""
    from components.common.dataset import read_manifest
    from components.common.model import model_spec_of

    manifest, _ = read_manifest(config.data)
    resolved = {"num_classes": manifest.num_classes, "image_shape": list(manifest.image_shape)}
    return model_spec_of({**dataclasses.asdict(config), "resolved": resolved})


def config_forward_flops(config) -> int:
    """Forward FLOPs per image of the network a TrainConfig trains on its dataset's images."""
    from components.common.model import build_model

    spec = config_model_spec(config)
    return flops.forward_flops(build_model(spec), spec.image_shape)


def run_epochs(config) -> float:
    """The epochs a TrainConfig's run of all the training images trains for."""
    return config.epochs if config.epochs else config.train_steps * config.batch_size / TRAIN_EXAMPLES


def whole_run_loop_seconds(config, window_steps: int, windows: int) -> float:
    """Median seconds per step of the training loop (bench/timing.py) at the cadence of summaries, checkpoints
    and validation of the config's whole run, not that of the short run that times it."""
    run_steps = math.ceil(run_epochs(config) * TRAIN_EXAMPLES / config.batch_size)
    seconds = timing.loop_window_seconds(config, window_steps, windows, run_steps, steady_state_steps(config))
    return statistics.median(seconds)


def steady_state_steps(config) -> int:
    """The steps before the loop's steady state: the whitening bias's, after which the step is traced again."""
    return math.ceil((config.whitening_bias_epochs or 0) * TRAIN_EXAMPLES / config.batch_size)


def print_presets_side_by_side(configs: dict[str, object], rounds: int, window_steps: int, windows: int) -> None:
    """Each preset's training loop timed in the same process, in turns (the order alternates by round), and the
    minutes its whole length takes at that rate: the wall-time comparison that holds even when the accuracy runs
    finished on different days. The peak of the preset's precision is measured after every preset's windows, so
    the fraction of it the loop reaches compares two measurements minutes apart on a machine whose speed drifts."""
    rates: dict[str, list[float]] = {preset: [] for preset in configs}
    peaks: dict[str, list[float]] = {preset: [] for preset in configs}
    for round_number in range(1, rounds + 1):
        order = list(configs) if round_number % 2 else list(reversed(configs))
        for preset in order:
            config = configs[preset]
            seconds = whole_run_loop_seconds(config, window_steps, windows)
            rates[preset].append(config.batch_size / seconds)
            peaks[preset].append(flops.peak_flops(flops.compute_dtype(config.precision)))
            print(f"round {round_number}: {preset} loop {rates[preset][-1]:.0f} images/s, {config.precision} peak "
                  f"{peaks[preset][-1] / 1e9:.0f} GFLOP/s", flush=True)  # fmt: skip
    print(f"\nSide by side in this run ({rounds} rounds, each the median of {windows} windows of {window_steps} "
          f"steps; each preset against the peak of its precision (bench/flops.py), the best of the measurements "
          f"after its windows):")  # fmt: skip
    print("| preset | batch | epochs | training images/s | minutes for its length at that rate "
          "| training GFLOP/s (of peak) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for preset, config in configs.items():
        rate = statistics.median(rates[preset])
        epochs = run_epochs(config)
        minutes = epochs * TRAIN_EXAMPLES / rate / 60
        achieved = 3 * config_forward_flops(config) * rate
        peak = max(peaks[preset])
        print(f"| {preset} | {config.batch_size} | {epochs:g} | {rate:.0f} | {minutes:.1f} | {achieved / 1e9:.0f} "
              f"({achieved / peak:.0%} of {peak / 1e9:.0f}) |")  # fmt: skip


def print_speed_ratio(data: str, preset: str, rounds: int, window_steps: int, windows: int) -> None:
    ratios = []
    for round_number in range(1, rounds + 1):
        bare, loop = speed_round(data, preset, round_number, window_steps, windows)
        ratios.append(loop / bare)
        print(f"round {round_number}: bare step {bare:.0f} images/s, the {preset} loop {loop:.0f} images/s, "
              f"ratio {ratios[-1]:.2f}", flush=True)  # fmt: skip
    print(f"ratio {preset} loop / bare step: {statistics.median(ratios):.2f} (median of {rounds} rounds, each the "
          f"median of {windows} windows of {window_steps} steps a side; target >= 0.95)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=None, help="default: each preset's own length")
    parser.add_argument("--presets", nargs="+", default=["cifar10_speedrun", "airbench94_muon"], choices=list(PRESETS))
    parser.add_argument("--train-args", default="", help='more train options for every run: "--width-multiplier 1.5"')
    parser.add_argument("--results", type=Path, help="a results file of an interrupted benchmark to continue")
    parser.add_argument("--side-by-side-rounds", type=int, default=2, help="0 skips timing the presets' loops in turns")
    parser.add_argument("--side-by-side-window-steps", type=int, default=3, help="steps per timed window")
    parser.add_argument("--side-by-side-windows", type=int, default=2, help="timed windows per preset and round")
    parser.add_argument("--speed-rounds", type=int, default=4, help="0 skips the speed comparison")
    parser.add_argument("--speed-window-steps", type=int, default=5, help="steps per timed window")
    parser.add_argument("--speed-windows", type=int, default=4, help="timed windows per side and round")
    parser.add_argument("--reference-runs", type=int, default=0, help="runs of the PyTorch reference (seeds 1..N)")
    parser.add_argument("--reference-precision", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--speed-preset", default="fast", choices=list(PRESETS), help="whose loop the speed times")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    data = full_training_set()
    timed_here = [*(arguments.presets if arguments.side_by_side_rounds else []), arguments.speed_preset]
    from components.train.config import TrainConfig

    default = TrainConfig.__dataclass_fields__["precision"].default
    precisions = [PRESETS[preset].get("precision", default) for preset in timed_here]
    print(timing.threads_as_training(precisions), flush=True)

    results_file = arguments.results or WORK / time.strftime("accuracy-%Y%m%d-%H%M%S.jsonl")
    print(f"results of finished runs: {results_file} (continue an interrupted benchmark with --results)", flush=True)
    earlier = finished_runs(results_file)
    train_arguments = shlex.split(arguments.train_args)
    results = []
    for seed in range(1, max(arguments.runs, arguments.reference_runs) + 1):
        sides = arguments.presets if seed <= arguments.runs else []
        for preset in [*sides, *(["reference"] if seed <= arguments.reference_runs else [])]:
            if preset == "reference":
                key = reference_key(seed, arguments.reference_precision)
            else:
                key = run_key(preset, arguments.epochs, seed, train_arguments)
            done = [result for result in earlier if all(result.get(name) == key[name] for name in key)]
            if done:
                results.append(done[-1])
                print(f"read back: {json.dumps(done[-1])}", flush=True)
                continue
            if preset == "reference":
                measured = reference_run(seed, arguments.reference_precision)
                result = {"epochs": measured["epochs"], "accuracy": measured["accuracy"],
                          "train_seconds": measured["timed_seconds"], "images_per_second":
                          measured["images_per_second"], "reference_train_seconds": measured["train_seconds"],
                          "forward_flops": None}  # fmt: skip
            else:
                with tempfile.TemporaryDirectory(dir=WORK) as model_dir:
                    result = train_and_evaluate(data, preset, arguments.epochs, seed, Path(model_dir), train_arguments)
            results.append({**result, **key, "finished": time.strftime("%Y-%m-%d %H:%M")})
            with results_file.open("a") as stream:
                stream.write(json.dumps(results[-1]) + "\n")
            print(json.dumps(results[-1]), flush=True)
    if results:
        print_accuracy_table(results)
        for preset in arguments.presets:
            print_reference_ratio(results, " ".join([preset, *train_arguments]))
    if arguments.side_by_side_rounds and len(arguments.presets) > 1:
        configs = {
            " ".join([preset, *train_arguments]): preset_config(data, preset, arguments.epochs, train_arguments)
            for preset in arguments.presets
        }
        print_presets_side_by_side(
            configs, arguments.side_by_side_rounds, arguments.side_by_side_window_steps,
            arguments.side_by_side_windows
        )  # fmt: skip
    if arguments.speed_rounds:
        print_speed_ratio(data, arguments.speed_preset, arguments.speed_rounds, arguments.speed_window_steps,
                          arguments.speed_windows)  # fmt: skip


if __name__ == "__main__":
    main()
