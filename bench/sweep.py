"""The sweep on real CIFAR-10: a small search around the fast recipe, against the recipe's own settings.

    .venv/bin/python bench/sweep.py [--trials 8] [--epochs 0.5]

The JPEG copy of CIFAR-10 (../shared/data, through bench/prepare_data.py's archive) is prepared once with a
validation split of 5,000 of the 50,000 training images. The search varies the fast recipe's (airbench94_muon's)
Muon learning rate and its weight decay at reduced epochs (every trial the same length); its first trial is the
recipe's own settings (enqueued), so the baseline is measured in the same run, on the same machine, under the same
load: the printed ratio is the best trial's validation accuracy over the recipe's. Trials are the train stage's own
processes (`python -m components.sweep`, as `make sweep` runs it), one at a time on this 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
WORK = REPOSITORY / "bench" / "work"

from bench.prepare_data import official_archive  # noqa: E402
from components.train.presets import FAST  # noqa: E402

SPACE = {
    "muon_learning_rate": {"low": 0.08, "high": 0.72, "log": True},
    "weight_decay": {"choices": [1.0e-5, FAST["weight_decay"], 1.2e-4]},
}
RECIPE = {"muon_learning_rate": FAST["muon_learning_rate"], "weight_decay": FAST["weight_decay"]}


def dataset_with_validation() -> str:
    target = WORK / "dataset-validation-5000"
    if not (target / "manifest.json").exists():
        subprocess.run(
            [sys.executable, "-m", "components.prepare_data", "--source", str(official_archive(None)),
             "--output", str(target), "--validation-fraction", "0.1"],
            cwd=REPOSITORY, check=True,
        )  # fmt: skip
    return str(target)


def enqueue_recipe(sweep_dir: Path) -> None:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from components.sweep import sweep as sweep_module

    sweep_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / sweep_module.STUDY)))
    study = optuna.create_study(study_name=sweep_module.STUDY_NAME, storage=storage, direction="maximize",
                                load_if_exists=True)  # fmt: skip
    if not study.trials:
        study.enqueue_trial(RECIPE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=0.5)
    parser.add_argument("--sweep-dir", type=Path, default=None, help="continue this sweep (default: a new one)")
    arguments = parser.parse_args()
    data = dataset_with_validation()
    sweep_dir = arguments.sweep_dir or WORK / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    enqueue_recipe(sweep_dir)
    options = {"preset": "fast", "epochs": arguments.epochs, "validation_every_steps": 4}
    command = [
        sys.executable, "-m", "components.sweep", "--data", data, "--sweep-dir", str(sweep_dir),
        "--space", json.dumps(SPACE), "--trials", str(arguments.trials), "--startup-trials", "3",
        "--train-options", json.dumps(options), "--poll-seconds", "5",
    ]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    started = time.monotonic()
    subprocess.run(command, cwd=REPOSITORY, check=True)
    wall = time.monotonic() - started
    records = [json.loads(line) for line in (sweep_dir / "trials.jsonl").read_text().splitlines()]
    recipe = next(r for r in records if r["params"] == RECIPE)
    best = json.loads((sweep_dir / "best.json").read_text())
    print(f"\n{len(records)} trials in {wall / 60:.1f} min ({arguments.epochs} epochs each): "
          f"{sum(r['state'] == 'complete' for r in records)} complete, "
          f"{sum(r['state'] == 'pruned' for r in records)} pruned, {sum(r['state'] == 'failed' for r in records)} "
          "failed")  # fmt: skip
    for record in sorted(records, key=lambda r: -(r["validation_accuracy"] or 0)):
        accuracy = record["validation_accuracy"]
        shown = "   -   " if accuracy is None else f"{accuracy:.4f}"
        print(f"  trial {record['trial']:2d} {record['state']:8s} {shown}  "
              + ", ".join(f"{k}={v:.4g}" for k, v in record["params"].items()))  # fmt: skip
    ratio = best["validation_accuracy"] / recipe["validation_accuracy"]
    print(f"recipe's settings: {recipe['validation_accuracy']:.4f}; best found (trial {best['trial']}): "
          f"{best['validation_accuracy']:.4f}; ratio best/recipe {ratio:.3f}")  # fmt: skip
    results = REPOSITORY / "bench" / "results" / "sweep.json"
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps({"epochs": arguments.epochs, "trials": records, "best": best, "recipe": recipe,
                                   "wall_seconds": wall, "ratio": ratio}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
