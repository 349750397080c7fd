"""The hyperparameter sweep: search spaces checked as the train stage checks settings; trials trained by the train
stage as processes, failed and pruned ones recorded while the search goes on; a stopped sweep continues without
training a finished trial again; what it leaves (trials.jsonl, best.json, the report, TensorBoard's HParams)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.sweep import space as space_module
from components.sweep import sweep as sweep_module
from components.sweep.__main__ import main as sweep_main
from components.sweep.space import SearchSpaceError, parse_space, read_space
from pipeline.parameters import CommandError, check_parameters

REPOSITORY = Path(__file__).resolve().parents[1]
# A trial that trains in a few seconds: a quarter-width ResNet-8, 40 steps, measured on the validation split every 10.
TINY = {
    "depth": 8, "width_multiplier": 0.25, "batch_size": 32, "train_steps": 40, "validation_every_steps": 10,
    "batch_norm_decay": 0.9, "log_every_steps": 20, "checkpoint_every_steps": 10, "histogram_every_steps": 0,
    "image_summaries": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def split_data(tmp_path_factory):
    """A synthetic dataset with a validation split (a fifth of the training images)."""
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    output = tmp_path_factory.mktemp("sweep") / "dataset"
    prepare_data(
        PrepareDataConfig(
            output=str(output), source="synthetic", synthetic_train_per_class=30, synthetic_eval_per_class=5,
            validation_fraction=0.2,
        )
    )  # fmt: skip
    return str(output)


def arguments(data: str, sweep_dir: Path, space: dict, trials: int, **options) -> list[str]:
    values = ["--data", data, "--sweep-dir", str(sweep_dir), "--space", json.dumps(space), "--trials", str(trials)]
    values += ["--train-options", json.dumps(options.pop("train_options", TINY)), "--poll-seconds", "0.5"]
    for name, value in options.items():
        values += [f"--{name.replace('_', '-')}", str(value)]
    return values


def records(sweep_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (sweep_dir / "trials.jsonl").read_text().splitlines()]


def enqueue(sweep_dir: Path, *params: dict) -> None:
    """Trials asked for in this order before the sweep starts (through the study's own journal)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    sweep_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / sweep_module.STUDY)))
    study = optuna.create_study(study_name=sweep_module.STUDY_NAME, storage=storage, direction="maximize")
    for values in params:
        study.enqueue_trial(values)


def test_a_failed_and_a_pruned_trial_are_recorded_and_the_search_goes_on(split_data, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Trial 0 learns; trial 1's learning rate makes the loss non-finite (the train stage fails it); trial 2 barely
    # moves, so its validation accuracy at the same steps falls below the median of those before it.
    enqueue(sweep_dir, {"learning_rate": 0.05}, {"learning_rate": 1e6}, {"learning_rate": 1e-6})
    space = {"learning_rate": {"low": 1e-6, "high": 1e6, "log": True}}
    # Long enough that the pruned trial cannot reach its end between the poll that reads it behind and the stop (40
    # steps had run out in that half second under load).
    options = {**TINY, "train_steps": 200, "checkpoint_every_steps": 50}
    code = sweep_main(
        arguments(split_data, sweep_dir, space, trials=4, startup_trials=1, pruner="median", train_options=options)
    )
    assert code == 0

    found = records(sweep_dir)
    assert [record["trial"] for record in found] == [0, 1, 2, 3]  # the search went on after the failure
    states = {record["trial"]: record["state"] for record in found}
    assert states[0] == "complete" and states[1] == "failed" and states[2] == "pruned", found
    assert "exit 1" in found[1]["reason"] and found[1]["params"] == {"learning_rate": 1e6}
    assert found[2]["curve"] and found[2]["curve"][-1][0] < options["train_steps"]  # stopped before its end
    assert found[0]["validation_accuracy"] == found[0]["curve"][-1][1] and found[0]["curve"][-1][0] == 200
    best = json.loads((sweep_dir / "best.json").read_text())
    complete = [r for r in found if r["state"] == "complete"]
    assert best["validation_accuracy"] == max(r["validation_accuracy"] for r in complete)
    assert best["train_options"] == {**options, **best["params"]}
    report = (sweep_dir / "report.html").read_text()
    assert "Best: trial" in report and "pruned" in report and "failed" in report and "<svg" in report
    # TensorBoard: one run per trial, with its settings for the HParams dashboard.
    runs = sorted(path.name for path in (sweep_dir / "tensorboard").iterdir() if path.is_dir())
    assert runs == ["trial-0000", "trial-0001", "trial-0002", "trial-0003"]


def test_a_stopped_sweep_continues_without_training_a_finished_trial_again(split_data, tmp_path):
    """Ctrl-C on the terminal (SIGINT to the sweep and its trials, one process group): the running trial saves a
    checkpoint and is neither recorded as failed nor counted; the sweep started again continues it."""
    sweep_dir = tmp_path / "sweep"
    space = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    slow = {**TINY, "train_steps": 120, "validation_every_steps": 40, "checkpoint_every_steps": 20}
    command = [sys.executable, "-m", "components.sweep",
               *arguments(split_data, sweep_dir, space, trials=2, pruner="none", train_options=slow)]  # fmt: skip
    first = subprocess.Popen(command, cwd=REPOSITORY, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until the first trial finished and the second has a checkpoint
        done = (sweep_dir / "trials.jsonl").exists() and records(sweep_dir)
        if done and list((sweep_dir / "trials").glob("0001-*/ckpt-*.index")):
            break
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGINT)  # as the terminal sends Ctrl-C: to every process of the group
    _out, log = first.communicate(timeout=180)
    assert first.returncode == 130, log[-3000:]
    assert [record["trial"] for record in records(sweep_dir)] == [0]  # the stopped trial is not recorded as failed
    assert "trial 1 failed" not in log

    second = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "trial 0 started" not in second.stderr  # a finished trial is never trained again
    assert "trial 1 was stopped with the sweep: it continues as a new trial" in second.stderr
    found = records(sweep_dir)
    assert [record["state"] for record in found] == ["complete", "complete"]
    continued = found[1]
    (trial_folder,) = (sweep_dir / "trials").glob("0001-*")  # the stopped trial's folder, named when it was asked
    assert continued["continues"] == 1 and continued["model_dirs"] == [f"trials/{trial_folder.name}"]
    trial_log = (sweep_dir / "logs" / f"{continued['trial']:04d}-0.log").read_text()
    assert "resum" in trial_log.lower()  # trained on from the checkpoint the stopped trial saved


def test_repeats_give_a_trial_its_mean_and_spread_and_the_time_budget_stops_the_search(split_data, tmp_path):
    space = {"learning_rate": {"choices": [0.05]}}
    repeated = tmp_path / "repeated"
    assert sweep_main(arguments(split_data, repeated, space, trials=1, repeats=2, pruner="none")) == 0
    (record,) = records(repeated)
    assert len(record["accuracies"]) == 2 and re.fullmatch(r"trials/0000-[0-9a-f]{6}-1", record["model_dirs"][1])
    assert record["validation_accuracy"] == pytest.approx(sum(record["accuracies"]) / 2)
    assert record["validation_accuracy_std"] == pytest.approx(
        abs(record["accuracies"][0] - record["accuracies"][1]) / 2
    )

    timed = tmp_path / "timed"  # 3 seconds: spent during the first trial, which is stopped; no other starts
    assert sweep_main(arguments(split_data, timed, space, trials=5, max_minutes=0.05, pruner="none")) == 0
    (stopped,) = records(timed)
    assert stopped["state"] == "failed" and stopped["reason"] == "out of time"

    limited = tmp_path / "limited"  # a trial's own limit, 2 seconds: that trial fails, the search goes on
    assert sweep_main(arguments(split_data, limited, space, trials=1, trial_max_minutes=0.035, pruner="none")) == 0
    (over,) = records(limited)
    assert over["state"] == "failed" and over["reason"].startswith("over its own time limit (0.035 min")


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ({"learning_rat": {"low": 0.1, "high": 0.2}}, "learning_rat: not a train setting a search can vary"),
        ({"model_dir": {"choices": ["a"]}}, "model_dir: not a train setting a search can vary"),
        # a range whose high is not low plus whole steps: Optuna would move high down to the last step, in silence
        (
            {"learning_rate": {"low": 0.01, "high": 0.1, "step": 0.04}},
            "learning_rate: high 0.1 is not low 0.01 plus whole steps of 0.04, and the search would end at 0.09: give "
            "high 0.09 or 0.13",
        ),
        ({"batch_size": {"low": 64, "high": 200, "step": 64}}, "the search would end at 192: give high 192 or 256"),
        # the sweep sets every training's seed itself: a space's would be overwritten in silence
        ({"seed": {"choices": [1, 2]}}, "seed: the sweep seeds each training (its --seed, and --repeats"),
        ({"learning_rate": {"low": 0.3, "high": 0.1}}, "low 0.3 and high 0.1 must be numbers, low < high"),
        ({"learning_rate": {"low": 0, "high": 0.1, "log": True}}, "a log range needs low > 0"),
        ({"batch_size": {"low": 0, "high": 64}}, "batch_size: 0 is not in [1,"),
        (
            {"depth": {"low": 8, "high": 20}},
            "depth: 9 is not of the form 6n+2 with n >= 1 (20, 32, 44, 56, 110) (a value "
            "of the range 8-20; give a step or choices",
        ),
        (
            {"depth": {"low": 8, "high": 32, "step": 4}},
            "depth: 12 is not of the form 6n+2 with n >= 1 (20, 32, 44, 56, 110) (a value of the range 8-32 by 4;",
        ),
        ({"weight_decay": {"choices": [0, 5e-4], "low": 0}}, "choices cannot be combined"),
        ({"weight_decay": {"choices": []}}, "choices must be a list of 1 to"),
        ({"depth": {"low": 8, "high": 20, "stride": 6}}, "unknown key(s) ['stride']"),
        ({}, "a search space is a non-empty mapping"),
    ],
)
def test_a_search_space_a_trial_would_fail_on_is_refused_in_one_line_naming_the_setting(space, expected):
    with pytest.raises(SearchSpaceError) as raised:
        parse_space(space, "space.yaml")
    assert str(raised.value).startswith("space.yaml: ") and expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_yaml_space_file_gives_integers_ranges_and_choices(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("learning_rate: {low: 1e-2, high: 0.3, log: true}\ndepth: {low: 8, high: 20, step: 6}\n"
                    "weight_decay: {choices: [0, 5e-4]}\n")  # fmt: skip
    space = read_space(str(path))
    kinds = {dimension.name: dimension for dimension in space.dimensions}
    assert kinds["depth"].integer and not kinds["learning_rate"].integer and kinds["learning_rate"].low == 0.01
    assert kinds["weight_decay"].choices == (0.0, 0.0005)  # a float setting's choices, as numbers
    inline = read_space('{"weight_decay": {"choices": [1e-05, 3.774e-05]}}')
    assert inline.dimensions[0].choices == (1e-05, 3.774e-05)


def test_a_bad_sweep_setting_exits_2_in_one_line_before_any_trial(split_data, tmp_path, capfd):
    no_validation = tmp_path / "no-validation"
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    prepare_data(PrepareDataConfig(output=str(no_validation), source="synthetic", synthetic_train_per_class=5,
                                   synthetic_eval_per_class=2, validation_fraction=0.0))  # fmt: skip
    space = {"learning_rate": {"low": 0.01, "high": 0.1}}
    assert sweep_main(arguments(str(no_validation), tmp_path / "a", space, trials=2)) == 2
    assert "has no validation split" in capfd.readouterr().err
    bad_option = arguments(split_data, tmp_path / "b", space, trials=2, train_options={"batch_size": -3})
    assert sweep_main(bad_option) == 2
    assert "train_options" in capfd.readouterr().err and not (tmp_path / "b" / "trials").exists()
    with pytest.raises(SystemExit) as stopped:  # argparse's own refusal of a choice, naming the choices
        sweep_main([*arguments(split_data, tmp_path / "c", space, trials=2), "--pruner", "hyperband"])
    assert stopped.value.code == 2 and "choose from 'median', 'asha', 'none'" in capfd.readouterr().err


def test_the_sweep_pipeline_is_compiled_with_the_training_pipelines_parameters_and_its_own():
    from pipeline import commands
    from pipeline.sweep_pipeline import SWEEP_PARAMETERS, cifar10_sweep
    from pipeline.training_pipeline import cifar10_pipeline

    training = set(cifar10_pipeline.component_spec.inputs)
    inputs = cifar10_sweep.component_spec.inputs
    assert set(inputs) == training | set(SWEEP_PARAMETERS)
    assert inputs["validation_fraction"].default == 0.1 and all(spec.description for spec in inputs.values())
    assert commands.compiled_path(cifar10_sweep).name == "sweep.yaml"
    with pytest.raises(CommandError, match="space: learning_rate: low 2 and high 1"):
        check_parameters(cifar10_sweep, {"space": {"learning_rate": {"low": 2, "high": 1}}})
    with pytest.raises(CommandError, match="trials"):
        check_parameters(cifar10_sweep, {"trials": 0})
    # start-up trials are TPE's and the median pruner's: with neither they would be ignored
    for pruner in ("none", "asha"):
        with pytest.raises(CommandError, match=f"startup_trials: .* sampler random with pruner {pruner} has neither"):
            check_parameters(cifar10_sweep, {"sampler": "random", "pruner": pruner, "startup_trials": 2})
    for used in ({"sampler": "random", "pruner": "median"}, {"sampler": "tpe", "pruner": "none"}):
        check_parameters(cifar10_sweep, {**used, "startup_trials": 2})


def test_a_space_whose_draws_a_trial_would_refuse_is_refused_before_any_trial_in_one_line(split_data, tmp_path,
                                                                                            capfd):  # fmt: skip
    """A setting's use can depend on another: momentum is the SGD family's. A space drawing adam beside a fixed
    momentum, or drawing both, would have a trial refused at its launch, later in the search: the sweep step and the
    pipeline's check before a run refuse it at once, naming the combination, and create nothing."""
    from pipeline.sweep_pipeline import cifar10_sweep

    optimizers = {"optimizer": {"choices": ["sgd", "adam"]}}
    both = {**optimizers, "momentum": {"low": 0.8, "high": 0.95}}
    for space, options in ((optimizers, {**TINY, "momentum": 0.8}), (both, TINY)):
        sweep_dir = tmp_path / f"sweep-{len(space)}"
        assert sweep_main(arguments(split_data, sweep_dir, space, trials=2, train_options=options)) == 2
        error = [line for line in capfd.readouterr().err.splitlines() if " INFO " not in line]
        assert len(error) == 1 and 'space: a trial with {"optimizer": "adam"' in error[0]
        assert "momentum: a setting of optimizers sgd, rmsprop and muon, which this training does not use" in error[0]
        assert not sweep_dir.exists()
        given = {"space": space} | ({"train_options": {"momentum": 0.8}} if "momentum" not in space else {})
        with pytest.raises(
            CommandError, match=r'^space: a trial with \{"optimizer": "adam".* would be refused: .*momentum: a setting'
        ):
            check_parameters(cifar10_sweep, given)
    # the same choices without the setting only some of them use: searched as before
    check_parameters(cifar10_sweep, {"space": {**optimizers, "learning_rate": {"low": 0.01, "high": 0.1}}})
    corners = parse_space({**both, "depth": {"choices": [8, 14]}}, "space").corners()
    assert len(corners) == 8 and corners[0] == {"optimizer": "sgd", "momentum": 0.8, "depth": 8}
    # beyond the limit of combinations: each value once, the others at their first
    wide = parse_space({**optimizers, "depth": {"choices": [8, 14, 20]}, "weight_decay": {"choices": [0, 5e-4]}}, "s")
    assert len(wide.corners()) == 12
    assert wide.corners(limit=5) == [
        {"optimizer": "sgd", "depth": 8, "weight_decay": 0},
        {"optimizer": "adam", "depth": 8, "weight_decay": 0},
        {"optimizer": "sgd", "depth": 14, "weight_decay": 0},
        {"optimizer": "sgd", "depth": 20, "weight_decay": 0},
        {"optimizer": "sgd", "depth": 8, "weight_decay": 5e-4},
    ]


def test_the_documented_space_is_the_same_space_after_kfps_struct():
    """docs/sweep.md's space, as the sweep step receives it from a KFP dict parameter (every number a double)."""
    import re

    from components.common import documents
    from components.common.kfp_parameters import as_delivered

    page = (REPOSITORY / "docs" / "sweep.md").read_text()
    documented = documents.load(re.search(r"```yaml\n(.*?)```", page, re.DOTALL).group(1), "docs/sweep.md", "space")
    delivered = as_delivered(documented)
    assert delivered["depth"] == {"low": 8.0, "high": 20.0, "step": 6.0}  # what the wire does
    dimensions = {dimension.name: dimension for dimension in parse_space(delivered, "space").dimensions}
    assert dimensions == {dimension.name: dimension for dimension in parse_space(documented, "space").dimensions}
    assert dimensions["depth"].integer and (dimensions["depth"].low, dimensions["depth"].step) == (8, 6)
    assert isinstance(dimensions["depth"].low, int) and not dimensions["learning_rate"].integer
    with pytest.raises(SearchSpaceError, match=r"depth: 8\.5 is not an integer"):
        parse_space({"depth": {"low": 8.5, "high": 20}}, "space")
    check_parameters(cifar10_sweep_pipeline(), {"space": documented})  # the check before a run sees the same


def cifar10_sweep_pipeline():
    from pipeline.sweep_pipeline import cifar10_sweep

    return cifar10_sweep


def test_every_search_setting_reaches_a_trial_as_the_train_stage_types_it():
    from components.sweep.config import SweepConfig

    config = SweepConfig(data="s3://bkb/d", sweep_dir="s3://bkb/s", space="{}", launcher="trainjob",
                         train_options={"gpus_per_worker": 1.0, "epochs": 2})  # fmt: skip
    settings = sweep_module.trial_settings(config, {"depth": 14.0, "learning_rate": 1}, "s3://bkb/s/trials/0003", 7)
    assert settings["depth"] == 14 and isinstance(settings["depth"], int) and settings["gpus_per_worker"] == 1
    assert settings["learning_rate"] == 1.0 and isinstance(settings["learning_rate"], float)
    assert (settings["model_dir"], settings["seed"], settings["data"]) == ("s3://bkb/s/trials/0003", 7, "s3://bkb/d")
    assert os.path.basename(settings["model_dir"]) == "0003"
    # trials that start no cluster job would ignore a job's setting: refused before any trial
    with pytest.raises(
        sweep_module.SweepError, match=r"--gpus-per-worker: a setting of a cluster job .* launcher local"
    ):
        local = dataclasses.replace(config, data="/d", sweep_dir="/s", launcher="local")
        sweep_module.trial_settings(local, {}, "/s/trials/0003", 7)


def test_the_sweep_pipeline_stopped_in_its_search_continues_then_trains_the_best_and_promotes_it(tmp_path):
    """Locally through kfp.local, end to end, as make sweep runs it: prepare with a validation split, search; Ctrl-C
    during the search says how to continue, and `RESUME=last` continues the study without training a finished trial
    again, then trains the best trial's settings on train + validation, evaluates on the test split and promotes."""
    from pipeline import local_run

    parameters = {
        "source": "synthetic", "synthetic_train_per_class": 20, "workers": 1,  # depth and batch size: the space's
        "train_steps": 40, "accuracy_threshold": 0.2, "trials": 2, "startup_trials": 2, "pruner": "none",
        # integer settings as docs/sweep.md writes them (a KFP dict parameter delivers 8 as 8.0: still an integer)
        "space": {"learning_rate": {"choices": [0.08, 0.05]}, "depth": {"low": 8, "high": 14, "step": 6},
                  "batch_size": {"choices": [32]}},
        "train_options": {"width_multiplier": 0.25, "log_every_steps": 20, "batch_norm_decay": 0.9,
                          "validation_every_steps": 10},
    }  # fmt: skip
    options = [f"--{name.replace('_', '-')}={json.dumps(value) if isinstance(value, dict) else value}"
               for name, value in parameters.items()]  # fmt: skip
    from tests.builders import interrupted_when

    command = [
        sys.executable,
        "-m",
        "pipeline.pipeline",
        "sweep",
        "local-run",
        "--output-root",
        str(tmp_path),
        *options,
    ]
    code, output = interrupted_when(command, r"trial 0 validation accuracy", REPOSITORY)  # the first trial recorded
    assert code == 130, output[-3000:]
    match = re.search(rf"interrupted .*; continue with: make sweep OUTPUT={re.escape(str(tmp_path))} "
                      r"RESUME=(cifar10-sweep-\S+) ", output)  # fmt: skip
    assert match, output[-3000:]
    (first_sweep,) = (tmp_path / match.group(1)).glob("sweep-component/sweep")
    finished_first = records(first_sweep)
    assert [record["trial"] for record in finished_first][:1] == [0]

    from pipeline.sweep_pipeline import cifar10_sweep

    resumed = local_run.local_run(cifar10_sweep, {}, tmp_path, resume="last")
    sweep_dir = local_run.sweep_directory_of(resumed)
    assert sweep_dir == first_sweep  # the study continued where it was kept
    found = records(sweep_dir)
    assert found[: len(finished_first)] == finished_first  # a finished trial is never trained again
    assert "trial 0 started" not in (resumed / local_run.RUN_LOG).read_text()
    assert len([record for record in found if record["state"] == "complete"]) == 2
    best = json.loads((sweep_dir / "best.json").read_text())
    assert best["params"]["batch_size"] == 32 and best["params"]["learning_rate"] in (0.08, 0.05)
    assert best["params"]["depth"] in (8, 14) and isinstance(best["params"]["depth"], int)
    (model_dir,) = resumed.glob(f"{local_run.TRAINING_TASKS}/model")
    trained = json.loads((model_dir / "config.json").read_text())
    assert {name: trained[name] for name in best["params"]} == best["params"]
    assert trained["train_on"] == "train+validation"
    assert trained["resolved"]["train_examples"] == 200  # train (160) and validation (40): all the training data
    assert not (model_dir / "validation.json").exists()  # nothing held out to measure on
    pointer = json.loads((tmp_path / "models" / "current.json").read_text())
    assert pointer["version"] == 1 and pointer["train_settings"]["train_on"] == "train+validation"
    (report,) = resumed.glob("sweep-component/report")
    assert "Best: trial" in report.read_text()
    (metrics,) = resumed.glob("sweep-component/executor_output.json")
    assert "best_validation_accuracy" in metrics.read_text()
    described = "\n".join(local_run.describe_run(resumed, tmp_path / "models", resumed / "local-run.log"))
    assert f"search: best trial {best['trial']}" in described and "accuracy " in described.splitlines()[0]


def test_the_sweep_pipeline_submits_through_the_kfp_client_and_its_yaml_is_current(tmp_path):
    from pipeline import commands
    from pipeline.sweep_pipeline import cifar10_sweep
    from tests.fake_kfp_api import API, FakeKfpApi

    space = '{"learning_rate": {"low": 0.01, "high": 0.3, "log": true}}'
    with FakeKfpApi() as kfp_api:
        code = commands.main(cifar10_sweep, ["run", "--host", kfp_api.url, "--space", space, "--trials", "8",
                                             "--source", "s3://bucket/cifar-10-python.tar.gz"])  # fmt: skip
        assert code == 0
        (run,) = kfp_api.bodies("POST", f"{API}/runs")
    assert run["runtime_config"]["parameters"]["trials"] == 8
    assert run["runtime_config"]["parameters"]["space"] == json.loads(space)
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "cifar10-sweep"
    fresh = commands.compile_pipeline(cifar10_sweep, tmp_path / "sweep.yaml")
    current = commands.compiled_path(cifar10_sweep)
    assert [line for line in fresh.read_text().splitlines() if "sdkVersion" not in line] == [
        line for line in current.read_text().splitlines() if "sdkVersion" not in line
    ], "pipeline/sweep.yaml is stale: run make compile"


def test_on_a_cluster_each_trial_is_a_trainjob_and_they_run_up_to_the_parallelism(tmp_path, s3_bucket, monkeypatch):
    """Against the strict Kubernetes stand-in (Trainer v2.3, a profile's RBAC), whose controller runs each TrainJob's
    pods as real worker processes: every trial is a TrainJob of the train stage, two at once."""
    from components.common import storage
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data
    from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi
    from tests.test_train_trainjob import TrainerController, install_runtime

    data = f"s3://{s3_bucket}/private-artifacts/{NAMESPACE}/datasets/synthetic"
    prepare_data(PrepareDataConfig(output=data, source="synthetic", synthetic_train_per_class=20,
                                   synthetic_eval_per_class=5, validation_fraction=0.2))  # fmt: skip
    sweep_dir = f"s3://{s3_bucket}/private-artifacts/{NAMESPACE}/sweeps/lr"
    controller, at_once = TrainerController(tmp_path), []

    def on_create(api, trainjob):
        at_once.append(len(api.jobs))
        controller(api, trainjob)

    options = {**TINY, "job_namespace": NAMESPACE, "worker_cpu": "1", "worker_memory": "2Gi"}
    space = {"learning_rate": {"choices": [0.02, 0.08]}}
    with FakeKubernetesApi(None, release="1.11", on_create=on_create) as api:
        keys = {"accesskey": os.environ["AWS_ACCESS_KEY_ID"], "secretkey": os.environ["AWS_SECRET_ACCESS_KEY"]}
        api.add_secret(NAMESPACE, "mlpipeline-minio-artifact", keys)
        install_runtime(api)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
        code = sweep_main(arguments(data, sweep_dir, space, trials=2, parallelism=2, launcher="trainjob",
                                    pruner="none", startup_trials=2, train_options=options,
                                    cache_dir=tmp_path / "cache"))  # fmt: skip
    assert code == 0
    assert len(api.created) == 2 and max(at_once) == 2  # both trials' TrainJobs at once
    configs = [json.loads(job["spec"]["trainer"]["args"][1]) for job in api.created]  # the workers' --config
    rates = sorted(config["learning_rate"] for config in configs)
    assert rates == [0.02, 0.08] and {config["train_steps"] for config in configs} == {TINY["train_steps"]}
    found = [json.loads(line) for line in storage.read_bytes(f"{sweep_dir}/trials.jsonl").decode().splitlines()]
    assert [record["state"] for record in found] == ["complete", "complete"], found
    assert all(record["model_dirs"][0].startswith("trials/") for record in found)  # relative: the folder travels
    assert json.loads(storage.read_bytes(f"{sweep_dir}/best.json"))["validation_accuracy"] > 0


def test_a_remote_sweeps_working_copy_is_kept_where_the_dataset_mirror_is(tmp_path, monkeypatch):
    """Under the project's cache folder (cache_dir, else XDG_CACHE_HOME's or ~/.cache's cifar10-pipeline), not in the
    working directory when XDG_CACHE_HOME is set but empty."""
    from components.common.dataset import default_cache_dir
    from components.sweep.sweep import SweepFolder

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.chdir(tmp_path)
    folder = SweepFolder("s3://bucket/sweeps/lr", None)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "cifar10-pipeline"
    assert folder.local.parent == default_cache_dir() / "sweeps" and folder.local.is_dir()
    given = SweepFolder("s3://bucket/sweeps/lr", str(tmp_path / "cache"))
    assert given.local.parent == tmp_path / "cache" / "sweeps"


# Katib's file and StdOut metrics collectors, as kubeflow/katib v0.19.0 writes them
# (pkg/metricscollector/v1beta1/file-metricscollector/file-metricscollector.go, parseLogsInTextFormat; the default
# filter from pkg/metricscollector/v1beta1/common/const.go): a line is read only if it contains a metric's name; each
# filter's first group is the metric's name, which must equal one of the metrics, its second the value.
KATIB_DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"


def katib_observations(lines: list[str], metrics: list[str], filters: list[str]) -> list[tuple[str, str]]:
    found = []
    for line in lines:
        if not any(metric in line for metric in metrics):
            continue
        for pattern in filters or [KATIB_DEFAULT_FILTER]:
            for groups in re.findall(pattern, line, re.ASCII):  # as in RE2, \w is ASCII
                groups = groups if isinstance(groups, tuple) else (groups,)
                if len(groups) >= 2 and groups[0].strip() in metrics:
                    found.append((groups[0].strip(), groups[1].strip()))
    return found


def test_the_katib_example_collects_its_objective_from_a_trials_real_output(split_data, tmp_path):
    """manifests/katib/'s Experiment: a trial rendered by Katib's rules runs its own options (its learning rate) on
    this machine's data, and its collector's rule, applied to what the train stage prints, finds each validation
    point's accuracy and loss."""
    from tests.test_katib import experiment_of, katib_trial, trial_arguments

    experiment = experiment_of("experiment.yaml")  # experiment-tfjob.yaml's collector is the same (tests/test_katib.py)
    objective = experiment["spec"]["objective"]
    metrics = [objective["objectiveMetricName"], *objective.get("additionalMetricNames", [])]
    source = experiment["spec"]["metricsCollectorSpec"].get("source", {})
    filters = source.get("filter", {}).get("metricsFormat", [])
    trial = katib_trial(experiment, "cifar10-learning-rate-x7k2pq9d", "team-a", {"learning_rate": "0.05"})
    cluster_only = ("--launcher", "--workers", "--data", "--model-dir", "--epochs")
    kept = [argument for argument in trial_arguments(trial) if not argument.startswith(cluster_only)]
    assert kept == ["--learning-rate=0.05"]
    model_dir = tmp_path / "trial"
    options = {**TINY, "train_steps": 20, "validation_every_steps": 10}
    ran = subprocess.run(
        [sys.executable, "-m", "components.train", "--launcher", "inprocess", "--data", split_data, "--model-dir",
         str(model_dir), *kept, *[f"--{name.replace('_', '-')}={value}" for name, value in options.items()
                                  if name != "learning_rate"]],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    observed = katib_observations((ran.stdout + ran.stderr).splitlines(), metrics, filters)
    curve = json.loads((model_dir / "validation.json").read_text())["curve"]
    accuracies = [float(value) for name, value in observed if name == objective["objectiveMetricName"]]
    assert accuracies and len(accuracies) == len(curve) == 2, observed
    assert accuracies == pytest.approx([point["accuracy"] for point in curve], abs=1e-4)
    assert {name for name, _value in observed} == set(metrics)


# -- one study, one driver, one journal -----------------------------------------------------------------------------


def test_a_second_sweep_on_a_study_being_run_is_refused_naming_its_driver(split_data, tmp_path, capsys):
    space = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    config = sweep_module.SweepConfig(data=split_data, sweep_dir=str(tmp_path / "sweep"), space=json.dumps(space))
    driver = sweep_module.Sweep(config)  # holds the study, as a running sweep does
    try:
        code = sweep_main(arguments(split_data, tmp_path / "sweep", space, trials=1))
    finally:
        driver.folder.release()
    assert code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"sweep_dir: {tmp_path / 'sweep'} is being written by pid {os.getpid()}" in message
    assert "a sweep folder has one driver at a time" in message


def test_a_study_continues_only_with_the_space_it_was_started_with(split_data, tmp_path, capsys):
    first = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    config = sweep_module.SweepConfig(data=split_data, sweep_dir=str(tmp_path / "sweep"), space=json.dumps(first))
    sweep_module.Sweep(config).folder.release()  # the study started: its space recorded
    other = {"learning_rate": {"low": 0.01, "high": 0.5, "log": True}}
    assert sweep_main(arguments(split_data, tmp_path / "sweep", other, trials=1)) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert '"high": 0.1' in message and '"high": 0.5' in message and "give the same space to continue it" in message
    study = sweep_module._study(sweep_module.SweepFolder(str(tmp_path / "sweep"), None), config)
    assert study.user_attrs["space"] == first and not study.trials  # nothing changed


def test_a_journal_cut_by_an_abrupt_end_is_read_up_to_its_last_whole_line_and_a_damaged_one_refused(tmp_path, caplog):
    journal = tmp_path / "study.journal"
    lines = [json.dumps({"op_code": 0, "worker_id": "a", "study_name": "s"}), json.dumps({"op_code": 5})]
    journal.write_text("\n".join(lines) + '\n{"op_code": 4, "worker_id": "a", "trial_')  # the write an end cut
    sweep_module.recover_journal(journal, "s3://bucket/sweep/study.journal")
    assert journal.read_text() == "\n".join(lines) + "\n"
    assert "its last line was cut short" in caplog.text

    journal.write_text(lines[0] + "\n{damaged\n" + lines[1] + "\n")
    with pytest.raises(sweep_module.SweepError) as raised:
        sweep_module.recover_journal(journal, "s3://bucket/sweep/study.journal")
    assert str(raised.value).startswith("s3://bucket/sweep/study.journal: the study journal is damaged at line 2 of 3")
    assert journal.read_text() == lines[0] + "\n{damaged\n" + lines[1] + "\n"  # left as it was, for a restore


def test_an_emptied_journal_beside_recorded_trials_is_refused_as_damaged(split_data, tmp_path, capsys):
    """Emptied (truncated, replaced by an empty file) while trials.jsonl records the study's trials: refused, not
    taken for a new study that would write over the first one's records; nothing changed."""
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "study.journal").write_bytes(b"")
    record = {"trial": 0, "state": "complete", "accuracy": 0.5, "settings": {"learning_rate": 0.1}}
    (sweep_dir / "trials.jsonl").write_text(json.dumps(record) + "\n")
    space = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    assert sweep_main(arguments(split_data, sweep_dir, space, trials=1)) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "study.journal: the study journal is empty, yet trials.jsonl beside it records finished trials" in message
    assert (sweep_dir / "trials.jsonl").read_text() == json.dumps(record) + "\n"
    with pytest.raises(sweep_module.SweepError):  # and the rule itself, without the folder
        sweep_module.recover_journal(sweep_dir / "study.journal", "s3://bkb/sweep/study.journal", trials_recorded=True)
    sweep_module.recover_journal(sweep_dir / "study.journal", "s3://bkb/sweep/study.journal")  # a new study's: fine


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_continued_study_samples_new_settings_not_trial_zeros_again(tmp_path, sampler):
    """The sampler's seed is the sweep's for a new study; a continued one goes on from the trials already asked, so
    its next trial is not trial 0's settings once more."""
    import optuna

    config = sweep_module.SweepConfig(data="d", sweep_dir=str(tmp_path / "sweep"), sampler=sampler,
                                      space=json.dumps({"learning_rate": {"low": 0.01, "high": 0.1}}))  # fmt: skip
    folder = sweep_module.SweepFolder(config.sweep_dir, None)
    distribution = {"learning_rate": optuna.distributions.FloatDistribution(0.01, 0.1)}
    first = sweep_module._study(folder, config)
    asked = first.ask(distribution)
    first.tell(asked, 0.5)
    again = sweep_module._study(folder, config)  # the sweep started again on its folder
    assert len(again.trials) == 1
    following = again.ask(distribution)
    assert following.params["learning_rate"] != asked.params["learning_rate"]


def test_a_lost_journal_never_puts_a_new_trial_into_an_old_trials_folder(split_data, tmp_path):
    """The study's journal emptied after a trial: the new study's trial 0 trains in a folder of its own, and a trial
    folder refuses to be trained with settings other than those it records."""
    sweep_dir = tmp_path / "sweep"
    enqueue(sweep_dir, {"learning_rate": 0.05})
    assert sweep_main(arguments(split_data, sweep_dir, {"learning_rate": {"choices": [0.05, 0.02]}}, trials=1)) == 0
    (first,) = records(sweep_dir)
    (sweep_dir / sweep_module.STUDY).write_bytes(b"")  # lost
    enqueue(sweep_dir, {"learning_rate": 0.02})
    assert sweep_main(arguments(split_data, sweep_dir, {"learning_rate": {"choices": [0.05, 0.02]}}, trials=1)) == 0
    (second,) = records(sweep_dir)
    assert first["trial"] == second["trial"] == 0 and first["model_dirs"] != second["model_dirs"]
    for record in (first, second):  # each folder trained, and records, the settings of its own trial
        recorded = json.loads((sweep_dir / record["model_dirs"][0] / sweep_module.TRIAL_RECORD).read_text())
        assert recorded["params"] == record["params"]
        config = json.loads((sweep_dir / record["model_dirs"][0] / "config.json").read_text())
        assert config["learning_rate"] == record["params"]["learning_rate"]
    with pytest.raises(sweep_module.SweepError, match="holds the training of other settings"):
        sweep_module.record_trial(str(sweep_dir / first["model_dirs"][0]), {"learning_rate": 0.02})


def test_a_trial_that_stops_reporting_is_failed_and_the_search_goes_on(split_data, tmp_path):
    sweep_dir = tmp_path / "sweep"
    space = {"learning_rate": {"choices": [0.05]}}
    # Half a second without a new validation measure: each trial is still starting TensorFlow by then.
    assert sweep_main(arguments(split_data, sweep_dir, space, trials=2, stall_minutes=0.01, pruner="none")) == 0
    found = records(sweep_dir)
    assert [record["state"] for record in found] == ["failed", "failed"], found
    assert all("stopped reporting: no new validation measure" in record["reason"] for record in found)


def test_a_sweep_folder_moved_elsewhere_continues_its_trial_in_the_trials_folder_there(split_data, tmp_path):
    """Its journal names trial folders relative to it; one an earlier release recorded at the folder's old absolute
    place is taken at the new place too."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    old, new = tmp_path / "old" / "sweep", tmp_path / "new" / "sweep"
    old.mkdir(parents=True)
    storage = JournalStorage(JournalFileBackend(str(old / sweep_module.STUDY)))
    study = optuna.create_study(study_name=sweep_module.STUDY_NAME, storage=storage, direction="maximize")
    study.enqueue_trial({"learning_rate": 0.05})
    running = study.ask()  # a trial the earlier sweep was training when it ended
    running.suggest_float("learning_rate", 0.01, 0.1, log=True)
    running.set_user_attr("model_dirs", [str(old / "trials" / "0000")])
    del storage, study
    (tmp_path / "new").mkdir()
    os.rename(old, new)

    space = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    assert sweep_main(arguments(split_data, new, space, trials=1)) == 0
    (record,) = records(new)
    assert record["continues"] == 0 and record["model_dirs"] == ["trials/0000"]
    assert json.loads((new / "trials" / "0000" / "config.json").read_text())["learning_rate"] == 0.05
    assert not (old).exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"curve": [{"step": 10, "accuracy": NaN}]}', "its validation curve cannot be read"),
        (b'{"curve": [{"step": 10, "accur', "its validation curve cannot be read"),
        (b'{"curve": [{"step": 10, "accuracy": 7.5}]}', "its validation curve cannot be read"),
        (None, "no validation measured"),
    ],
    ids=["non-finite", "truncated", "out-of-range", "missing"],
)
def test_a_trials_unreadable_or_missing_validation_curve_fails_that_trial_and_the_search_goes_on(
    split_data, tmp_path, content, expected
):
    """The trial's own files are its outcome: recorded failed with the reason, never the sweep's end, and a sweep
    continued later does not train it again."""
    from optuna.trial import TrialState

    from components.common.model_directory import VALIDATION_CURVE

    space = {"learning_rate": {"low": 0.01, "high": 0.1, "log": True}}
    config = sweep_module.SweepConfig(data=split_data, sweep_dir=str(tmp_path / "sweep"), space=json.dumps(space),
                                      trials=3, poll_seconds=0.1)  # fmt: skip
    sweep = sweep_module.Sweep(config)
    try:
        trial = sweep.study.ask()
        model_dir = tmp_path / "sweep" / "trials" / "0000-abcdef"
        model_dir.mkdir(parents=True)
        running = sweep_module.RunningTrial(trial, sweep.space.suggest(trial), [str(model_dir)])
        # A training that measured (or wrote) this and runs on, or (missing) ends having measured nothing.
        running.process = subprocess.Popen(["sleep", "30" if content is not None else "0"])
        sweep.running.append(running)
        if content is not None:
            (model_dir / VALIDATION_CURVE).write_bytes(content)
        deadline = time.monotonic() + 20
        while sweep.running and time.monotonic() < deadline:
            sweep._watch()
            time.sleep(0.1)
        assert not sweep.running
    finally:
        sweep.folder.release()
    (failed,) = sweep.finished()
    assert failed.state == TrialState.FAIL and failed.user_attrs["reason"].startswith(expected)
    assert running.process.poll() is not None  # stopped, not left running
    again = sweep_module.Sweep(config)  # the sweep continued later: the failed trial stays failed, never retrained
    try:
        (still,) = again.finished()
        assert (still.number, still.state) == (failed.number, TrialState.FAIL)
        assert again.study.ask().number == failed.number + 1
    finally:
        again.folder.release()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("[" * 20000 + "]" * 20000, "nested 20,000 levels deep, more than the 32"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested 5,001 levels deep"),
        ("a" * 5000, "neither inline JSON ({...}) nor a file that can be read (File name too long)"),
        ("/", "a folder, not a search space"),
    ],
    ids=["deep list", "deep object", "name too long", "a folder"],
)
def test_a_space_that_is_neither_json_nor_a_readable_file_is_one_line(given, expected):
    """The sweep's --space and the run's --space option (its parser) each refuse in one line, never a traceback."""
    import argparse

    from pipeline.commands import parse_json

    with pytest.raises(space_module.SearchSpaceError, match=re.escape(expected)):
        space_module.read_space(given)
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_json(given)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400


@pytest.mark.parametrize(
    ("train_options", "expected"),
    [
        # trials that train on the validation split they are measured on would choose nothing
        ({"train_on": "train+validation"}, "train_options: 'train_on' is set by the sweep itself: its trials train"),
        ({"seed": 3}, "train_options: 'seed' is set by the sweep itself: each training's comes from the sweep's"),
    ],
)
def test_train_options_the_sweep_sets_itself_are_refused_before_the_run(train_options, expected):
    """The sweep sets these in every training over the train options: given, they would be overwritten in silence
    (or, train_on, measure each trial on its own training data). Refused before any step, as the sweep step would."""
    from pipeline.sweep_pipeline import cifar10_sweep

    with pytest.raises(CommandError, match=re.escape(expected)):
        check_parameters(cifar10_sweep, {"train_options": train_options}, on_cluster=False)
    with pytest.raises(ValueError, match=re.escape(expected)):
        sweep_module.SweepConfig(data="d", sweep_dir="s", space="{}", train_options=train_options)


def test_a_sweep_that_completed_no_trial_says_so_and_where_to_look(tmp_path):
    """Every trial failed (out of time, say) or was pruned: the final training has nothing to train, and says why in
    words a person acts on, not a missing best.json."""
    with pytest.raises(sweep_module.SweepError) as refused:
        sweep_module.read_best(str(tmp_path))
    line = str(refused.value)
    assert line.startswith(f"{tmp_path}: no trial of the sweep completed, so there is no best one to train")
    assert "trials.jsonl says how each ended" in line and "best.json" not in line


def test_a_local_sweep_on_a_folder_another_sweep_drives_is_refused_before_the_run(tmp_path, capsys):
    """Refused at once, before any step (the sweep step would refuse it after the data was prepared)."""
    from components.common import writer_claim
    from pipeline import commands
    from pipeline.sweep_pipeline import cifar10_sweep

    folder = tmp_path / "sweep"
    folder.mkdir()
    driver = writer_claim.DirectoryClaim(folder, str(folder), sweep_module.SWEEP_FOLDER)
    driver.acquire()  # another sweep drives this folder
    try:
        started = time.monotonic()
        code = commands.main(cifar10_sweep, ["local-run", "--output-root", str(tmp_path / "out"), "--sweep-dir",
                                             str(folder), "--train-steps", "3"])  # fmt: skip
    finally:
        driver.release()
    assert code == 2 and time.monotonic() - started < 30
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"sweep_dir: {folder} is being written by pid {os.getpid()}" in message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("cifar10-sweep-*"))
