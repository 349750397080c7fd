"""Each step stopped the way Kubeflow stops a step's pod, then retried as the pipeline retries it.

A run cancelled from the KFP UI, an eviction or a drained node gives a step SIGTERM and, about a second later,
SIGKILL for every process of the pod (tests/step_pod.py plays Argo's emissary and KFP's launcher from the compiled
pipeline's own command). Whatever the step was doing, its retry completes with the right outcome: the dataset
whole, training on from its checkpoint to the planned step, the evaluation written, one promotion (not two, not
half), and a sweep that continues the same trials with their own settings in their own folders.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.step_pod import REPOSITORY, Step

PIPELINE = REPOSITORY / "pipeline" / "pipeline.yaml"
SWEEP_PIPELINE = REPOSITORY / "pipeline" / "sweep.yaml"
TINY_TRAINING = {"depth": 8, "batch_size": 16, "options": {"width_multiplier": 0.25, "log_every_steps": 10}}


def stopped_then_retried(task: str, arguments: dict, root: Path, stop_at: str, pipeline: Path = PIPELINE):
    """The step's pod stopped at the first log line matching `stop_at`, then the step retried to its end."""
    first = Step(pipeline, task, arguments, root).run(stop_at=stop_at)
    assert first.stopped, f"{task} ended before {stop_at!r}:\n{first.log[-3000:]}"
    assert first.code != 0, first.log[-3000:]
    retried = Step(pipeline, task, arguments, root).run()
    assert retried.code == 0, retried.log[-5000:]
    return first, retried


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small synthetic dataset, prepared by the compiled step."""
    root = tmp_path_factory.mktemp("prepared")
    arguments = {"source": "synthetic", "synthetic_train_per_class": 30, "synthetic_eval_per_class": 5}
    end = Step(PIPELINE, "prepare-data-component", arguments, root).run()
    assert end.code == 0, end.log[-3000:]
    return end.artifacts["dataset"]


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    end = Step(PIPELINE, "train-component", {"dataset": prepared, "train_steps": 20, **TINY_TRAINING}, root).run()
    assert end.code == 0, end.log[-3000:]
    return end.artifacts["model"]


def test_the_data_step_ended_while_publishing_is_completed_by_its_retry(tmp_path):
    from components.common.dataset import open_dataset

    arguments = {"source": "synthetic", "synthetic_train_per_class": 800, "synthetic_eval_per_class": 100,
                 "examples_per_shard": 500}  # fmt: skip
    first, retried = stopped_then_retried("prepare-data-component", arguments, tmp_path, stop_at=r"split train:")
    assert "published" not in first.log, first.log[-2000:]  # it ended mid-way
    dataset = retried.artifacts["dataset"]
    verified = open_dataset(dataset.uri)  # every shard's checksum, against the manifest
    counts = {name: split.num_examples for name, split in verified.manifest.splits.items()}
    assert counts["train"] + counts["validation"] == 8000 and counts["eval"] == 1000
    assert dataset.metadata["manifest_sha256"]
    leftovers = [path.name for path in Path(dataset.uri).rglob("*") if path.name.startswith((".", "tmp"))]
    assert not [name for name in leftovers if not name.endswith(".lock")], leftovers  # nothing half-written


def test_the_train_step_ended_mid_training_trains_on_from_its_checkpoint_to_the_planned_step(prepared, tmp_path):
    arguments = {"dataset": prepared, "train_steps": 60, **TINY_TRAINING}
    arguments["options"] = {**TINY_TRAINING["options"], "checkpoint_every_steps": 10}
    _first, retried = stopped_then_retried(
        "train-component", arguments, tmp_path, stop_at=r"saved checkpoint .*ckpt-20"
    )
    assert "resum" in retried.log.lower()  # from the checkpoint the ended attempt left, not from scratch
    model = retried.artifacts["model"]
    assert model.metadata["step"] == 60 and model.metadata["checkpoint"].endswith("ckpt-60")


def test_the_evaluate_step_ended_mid_evaluation_is_evaluated_again_by_its_retry(prepared, trained, tmp_path):
    arguments = {"dataset": prepared, "model": trained}
    _first, retried = stopped_then_retried("evaluate-component", arguments, tmp_path, stop_at=r"evaluat")
    evaluation = retried.artifacts["evaluation"]
    assert retried.artifacts["metrics"].metadata["accuracy"] >= 0
    assert json.loads(Path(evaluation.uri).read_text())["checkpoint"].endswith("ckpt-20")


def test_the_promote_step_ended_mid_promotion_promotes_once_on_its_retry(prepared, trained, tmp_path):
    evaluated = Step(PIPELINE, "evaluate-component", {"dataset": prepared, "model": trained}, tmp_path / "evaluated")
    end = evaluated.run()
    assert end.code == 0, end.log[-3000:]
    root = tmp_path / "served"
    arguments = {"model": trained, "evaluation": end.artifacts["evaluation"], "dataset": prepared,
                 "promotion_root": str(root)}  # fmt: skip
    _first, retried = stopped_then_retried("promote-component", arguments, tmp_path, stop_at=r"claimed version 1")
    version = retried.outputs["Output"]  # the ended attempt's claim (1) is removed; its number is not reused
    assert sorted(path.name for path in root.iterdir() if path.name.isdigit()) == [str(version)]  # once, whole
    assert json.loads((root / "current.json").read_text())["version"] == version
    assert (root / str(version) / "saved_model.pb").exists()
    assert not list((root / ".staging").iterdir())  # nothing half-written left


def test_a_sweep_ended_between_trials_and_inside_a_trial_continues_each_trial_with_its_own_settings(tmp_path):
    from components.sweep import sweep as sweep_module

    root = tmp_path / "sweep"
    prepared_arguments = {"source": "synthetic", "synthetic_train_per_class": 30, "synthetic_eval_per_class": 5,
                          "validation_fraction": 0.2}  # fmt: skip
    data = Step(PIPELINE, "prepare-data-component", prepared_arguments, tmp_path / "data").run()
    assert data.code == 0, data.log[-3000:]
    train_options = {"width_multiplier": 0.25, "train_steps": 90, "validation_every_steps": 30,
                     "checkpoint_every_steps": 15, "log_every_steps": 30, "batch_norm_decay": 0.9}  # fmt: skip
    arguments = {
        "dataset": data.artifacts["dataset"], "space": {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}},
        "trials": 3, "pruner": "none", "startup_trials": 3, "depth": 8, "batch_size": 32,
        "train_options": train_options,
    }  # fmt: skip

    def attempt(stop_at: str | None):
        return Step(SWEEP_PIPELINE, "sweep-component", arguments, root).run(stop_at=stop_at)

    between = attempt(r"trial 0 validation accuracy")  # trial 0 told; the next one not yet measured
    assert between.stopped and between.code != 0
    sweep_dir = Path(Step(SWEEP_PIPELINE, "sweep-component", arguments, root).artifacts["sweep"][1])

    inside = Step(SWEEP_PIPELINE, "sweep-component", arguments, root)
    inside.start()
    lines, stopped_in = [], None
    for line in inside.process.stdout:  # a second driver while this one runs a trial: refused, naming it
        lines.append(line)
        measured = re.search(r"trial (\d+) step \d+: validation accuracy", line)
        if measured and stopped_in is None:
            second = subprocess.run(
                [sys.executable, "-m", "components.sweep", "--data", data.artifacts["dataset"].uri, "--sweep-dir",
                 str(sweep_dir), "--space", json.dumps(arguments["space"]), "--trials", "3"],
                cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert second.returncode == 2, second.stderr[-2000:]
            assert f"sweep_dir: {sweep_dir} is being written by pid" in second.stderr.splitlines()[-1]
            inside.stop()  # and the pod stopped inside that trial
            stopped_in = int(measured.group(1))
    assert inside.process.wait(timeout=60) != 0 and stopped_in is not None, "".join(lines)[-3000:]

    finished = attempt(None)
    assert finished.code == 0, finished.log[-5000:]
    assert "trial 0 started" not in finished.log  # a finished trial is never trained again
    found = [json.loads(line) for line in (sweep_dir / "trials.jsonl").read_text().splitlines()]
    assert [record["state"] for record in found] == ["complete"] * 3, found
    folders = [record["model_dirs"][0] for record in found]
    assert len(set(folders)) == 3 and all(folder.startswith("trials/") for folder in folders)
    for record in found:  # each folder trained with, and records, its own trial's settings, to the planned step
        folder = sweep_dir / record["model_dirs"][0]
        assert json.loads((folder / sweep_module.TRIAL_RECORD).read_text())["params"] == record["params"]
        assert json.loads((folder / "config.json").read_text())["learning_rate"] == record["params"]["learning_rate"]
        assert record["curve"][-1][0] == 90
    # The trial the pod ended inside was continued with its settings, in its folder.
    (continued,) = [record for record in found if record.get("continues") == stopped_in]
    ended = study_trials(sweep_dir)[stopped_in]
    assert continued["params"] == ended.params and continued["model_dirs"] == ended.user_attrs["model_dirs"]


def study_trials(sweep_dir: Path) -> list:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from components.sweep import sweep as sweep_module

    storage = JournalStorage(JournalFileBackend(str(sweep_dir / sweep_module.STUDY)))
    return optuna.load_study(study_name=sweep_module.STUDY_NAME, storage=storage).trials
