"""`run` and `schedule` submit through the real kfp.Client to a strict stand-in of the KFP REST API (v2beta1);
the tests assert on what the backend receives: each task's own caching, the run and recurring-run settings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline import commands
from pipeline.cron import cron_problem
from pipeline.training_pipeline import cifar10_pipeline
from tests.fake_kfp_api import API, FakeKfpApi, RefusedError, check_model

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture
def kfp_api():
    with FakeKfpApi() as api:
        yield api


def compiled_caching() -> dict[str, bool]:
    """{task: enable_cache} as compiled, for every task of every DAG (the root and the dsl.If branches)."""
    spec = next(yaml.safe_load_all(commands.COMPILED.read_text()))
    return _caching_of(spec)


def _caching_of(spec: dict) -> dict[str, bool]:
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec.get("components", {}).values() if "dag" in c]
    return {
        name: bool(task.get("cachingOptions", {}).get("enableCache", False))
        for dag in dags
        for name, task in dag["tasks"].items()
    }


def test_a_submitted_run_keeps_each_tasks_own_caching(kfp_api):
    code = commands.main(
        cifar10_pipeline,
        ["run", "--host", kfp_api.url, "--source", "s3://bucket/cifar-10-python.tar.gz", "--workers", "4",
         "--launcher", "tfjob", "--gpus-per-worker", "1", "--run-name", "nightly-1", "--experiment", "team"],
    )  # fmt: skip
    assert code == 0

    (experiment,) = kfp_api.bodies("POST", f"{API}/experiments")
    assert experiment["display_name"] == "team"
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    assert run["display_name"] == "nightly-1"
    assert run["experiment_id"] == next(iter(kfp_api.experiments))
    assert run["runtime_config"]["parameters"] == {
        "source": "s3://bucket/cifar-10-python.tar.gz",
        "workers": 4,
        "launcher": "tfjob",
        "gpus_per_worker": 1,
    }
    sent = _caching_of(run["pipeline_spec"]["pipeline_spec"])
    assert sent == compiled_caching()
    # What must never come from a cache: the source's fingerprint, training, evaluation and the warm-start choice.
    cached = {task for task, enabled in sent.items() if enabled}
    assert cached == {"prepare-data-component"}, cached  # with --prepare-fan-out, its parts too


def test_a_schedule_keeps_each_tasks_own_caching_and_runs_one_at_a_time(kfp_api):
    code = commands.main(
        cifar10_pipeline,
        ["schedule", "--host", kfp_api.url, "--cron", "0 30 2 * * *", "--promotion-root", "s3://bucket/models",
         "--epochs", "30", "--train-options", '{"ema_decay": 0.999}'],
    )  # fmt: skip
    assert code == 0
    other = ["schedule", "--host", kfp_api.url, "--cron", "0 0 4 * * *", "--promotion-root", "s3://bkb/m",
             "--name", "x",
             "--data-check", "warn"]  # fmt: skip
    assert commands.main(cifar10_pipeline, other) == 0
    assert len(kfp_api.experiments) == 1, "the second submission reuses the experiment"

    (recurring, warned) = kfp_api.bodies("POST", f"{API}/recurringruns")
    assert warned["runtime_config"]["parameters"]["data_check"] == "warn"  # the schedule's default, overridden
    assert recurring["display_name"] == "cifar10-pipeline-retraining"
    assert recurring["trigger"] == {"cron_schedule": {"cron": "0 30 2 * * *"}}
    assert int(recurring["max_concurrency"]) == 1 and recurring["no_catchup"] is True
    assert recurring["mode"] == "ENABLE"
    assert recurring["runtime_config"]["parameters"] == {
        "warm_start_from_promoted": True,
        "data_check": "block",  # a schedule promotes nothing trained on data that changed
        "promotion_root": "s3://bucket/models",
        "epochs": 30.0,
        "train_options": {"ema_decay": 0.999},
    }
    assert _caching_of(recurring["pipeline_spec"]["pipeline_spec"]) == compiled_caching()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["schedule", "--cron", "0 3 * * *", "--promotion-root", "gs://bkb"],
            "has 5 fields; KFP's cron has six, seconds first",
        ),
        (["schedule", "--cron", "0 0 3 * * *"], "a schedule needs --promotion-root"),
    ],
)
def test_bad_submission_requests_are_clear_errors_and_send_nothing(kfp_api, capsys, arguments, message):
    assert commands.main(cifar10_pipeline, [arguments[0], "--host", kfp_api.url, *arguments[1:]]) == 2
    assert message in capsys.readouterr().err
    assert not kfp_api.bodies("POST", f"{API}/runs") and not kfp_api.bodies("POST", f"{API}/recurringruns")


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("61 0 3 * * *", "seconds '61': 61 is above 59"),
        ("0 0 24 * * *", "hours '24': 24 is above 23"),
        ("0 0 3 0 * *", "day of month '0': 0 is below 1"),
        ("0 0 3 * 13 *", "month '13': 13 is above 12"),
        ("0 0 3 * * 7", "day of week '7': 7 is above 6"),
        ("0 0 3 * * monday", "day of week 'monday': 'monday' is not a number or a name (sun, mon,"),
        ("0 */0 * * * *", "minutes '*/0': a step of 0"),
        ("0 30-10 * * * *", "minutes '30-10': 30-10 runs backwards"),
        ("0 0 3,x * * *", "hours '3,x': 'x' is not a number"),
        ("0 0 1-2-3 * * *", "more than one '-'"),
        ("@nightly", "'@nightly' is not a descriptor KFP knows"),
        ("@every soon", "@every 'soon' is not a duration"),
        # taken by the server, but not what was written: a date no month has never comes, and an interval is run in
        # whole seconds, at least one
        ("0 0 3 31 2 *", "day of month '31' in month '2': no such date, so it would never run"),
        ("0 0 3 31 4,6,9,11 ?", "no such date"),
        ("@every 0s", "@every '0s': KFP runs an interval in whole seconds, at least one, so it would run every 1s"),
        ("@every 90.5s", "so it would run every 90s"),
    ],
)
def test_a_cron_kfp_would_refuse_is_refused_before_anything_is_sent(kfp_api, capsys, cron, message):
    """Checked as the KFP API server parses it (robfig/cron v1: six fields, seconds first, each in its range, or a
    descriptor): one line naming the field and value, exit 2, nothing submitted."""
    arguments = ["schedule", "--host", kfp_api.url, "--cron", cron, "--promotion-root", "gs://bkb/m"]
    assert commands.main(cifar10_pipeline, arguments) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1, error
    assert not kfp_api.bodies("POST", f"{API}/recurringruns")


@pytest.mark.parametrize(
    "cron", ["@daily", "@every 6h", "@every 1h30m", "0 0/15 * * * *", "0 0 3 * JAN-MAR MON-FRI", "0 0 3 ? * SUN",
             "*/10 * * * * *", "0 0 3 1,15 * *", "0 5/20 8-18 * * 1-5", "0 0 3 29 2 *", "0 0 3 31 2 MON",
             "0 0 3 31 */2 *", "@every 1.5h", "@every 1000ms"],
)  # fmt: skip
def test_every_cron_form_kfp_takes_is_taken(cron):
    assert cron_problem(cron) is None


def test_a_schedule_by_descriptor_is_submitted_as_given(kfp_api):
    arguments = ["schedule", "--host", kfp_api.url, "--cron", "@every 12h", "--promotion-root", "gs://bkb/m"]
    assert commands.main(cifar10_pipeline, arguments) == 0
    (recurring,) = kfp_api.bodies("POST", f"{API}/recurringruns")
    assert recurring["trigger"] == {"cron_schedule": {"cron": "@every 12h"}}


def test_no_endpoint_is_a_clear_error(capsys):
    assert commands.main(cifar10_pipeline, ["run", "--host", ""]) == 2
    assert "no KFP endpoint: set KFP_HOST" in capsys.readouterr().err


def test_the_stand_in_refuses_what_the_backend_would_refuse(kfp_api):
    """The stand-in is only useful if it is strict: unknown fields, wrong types, unknown parameters, bad cron."""
    with pytest.raises(RefusedError, match="unknown field 'enable_caching'"):
        check_model({"display_name": "x", "enable_caching": True}, "V2beta1Run", "run")
    with pytest.raises(RefusedError, match=r"run.display_name: expected str"):
        check_model({"display_name": 3}, "V2beta1Run", "run")
    import kfp
    import kfp_server_api

    client = kfp.Client(host=kfp_api.url)
    experiment_id = client.create_experiment("e").experiment_id
    with pytest.raises(kfp_server_api.ApiException, match=r"epochs_typo.* is not a parameter of the pipeline"):
        client.run_pipeline(experiment_id, "bad", str(commands.COMPILED), params={"epochs_typo": 3})
    with pytest.raises(kfp_server_api.ApiException, match=r"parameters.workers: .*4.* is not a NUMBER_INTEGER"):
        client.run_pipeline(experiment_id, "bad", str(commands.COMPILED), params={"workers": "4"})
    with pytest.raises(kfp_server_api.ApiException, match="KFP's cron has six fields"):
        client.create_recurring_run(
            experiment_id, "bad", cron_expression="0 3 * * *", pipeline_package_path=str(commands.COMPILED)
        )


def make(*arguments: str, **variables: str) -> subprocess.CompletedProcess:
    """`make` in the repository with this interpreter's environment (the one `make install` created)."""
    assignments = [f"{name}={value}" for name, value in {"VENV": sys.prefix, **variables}.items()]
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPOSITORY), *arguments, *assignments],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_run_and_make_schedule_pass_every_train_option_the_user_set(kfp_api):
    options = '{"ema_decay": 0.999, "optimizer": "adamw"}'
    ran = make("run", KFP_HOST=kfp_api.url, TRAIN_OPTIONS=options, EPOCHS="30", EXTRA="--launcher tfjob")
    assert ran.returncode == 0, ran.stderr[-2000:]
    scheduled = make("schedule", KFP_HOST=kfp_api.url, TRAIN_OPTIONS=options, PROMOTION_ROOT="s3://bucket/models")
    assert scheduled.returncode == 0, scheduled.stderr[-2000:]
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    (recurring,) = kfp_api.bodies("POST", f"{API}/recurringruns")
    for sent in (run, recurring):
        assert sent["runtime_config"]["parameters"]["train_options"] == json.loads(options)
    assert (
        run["runtime_config"]["parameters"]["epochs"] == 30.0
        and "train_steps" not in run["runtime_config"]["parameters"]
    )
    assert run["runtime_config"]["parameters"]["launcher"] == "tfjob"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--epochs", "1", "--train-steps", "300"], "train_steps and epochs: give one of them"),
        (["--launcher", "bogus"], "launcher: 'bogus' is not one of auto, trainjob, tfjob, pod"),
        (["--train-options", '{"optimiser": "sgd"}'], "optimiser"),
        (["--train-options", '{"depth": 56}'], "are pipeline parameters"),
        (["--depth", "21"], "depth: 21 is not of the form 6n+2"),
        (["--workers", "3", "--batch-size", "128"], "does not split evenly over 3 workers"),
        # what KFP cannot carry (JSON has no infinity), and what a later step (evaluate, promote, the training pod,
        # prepare_data) would refuse only after the data was prepared or the model trained
        (["--accuracy-threshold", "inf"], "accuracy_threshold: inf is not a finite number"),
        (["--train-options", "[1]"], "train_options: [1] is not a JSON object"),
        (["--accuracy-threshold", "1.5"], "accuracy_threshold: 1.5 is not in [0, 1]"),
        (["--baseline-tolerance", "-0.1"], "baseline_tolerance: -0.1 is not in [0, 1]"),
        (["--serving-version", "9.9"], "serving_version: no op definitions of TensorFlow 9.9"),
        (["--train-step-memory", "16 GB"], "train_step_memory: '16 GB' is not a Kubernetes quantity"),
        (["--prepare-step-memory", "16 GB"], "prepare_step_memory: '16 GB' is not a Kubernetes quantity"),
        (["--max-source-megabytes", "0"], "max_source_megabytes: 0 is not in [1, 1048576]"),
        (["--train-step-gpus", "-1"], "train_step_gpus: -1 is not a number of GPUs"),
        (["--validation-fraction", "1.5"], "validation_fraction: 1.5 is not in [0, 1)"),
        (["--source-sha256", "z" * 64], "is not a 64-digit hex SHA-256"),
        (["--resize", "32y32"], "resize: '32y32' is not HEIGHTxWIDTH"),
        (["--promotion-root", "https://host/models"], "promotion_root: 'https://host/models': https:// is not a"),
        (["--source", "ftp://host/cifar.tar.gz"], "source: 'ftp://host/cifar.tar.gz': ftp:// is not a scheme"),
    ],
)
def test_bad_run_parameters_fail_in_seconds_before_anything_runs(kfp_api, capsys, arguments, message):
    for command in (["run", "--host", kfp_api.url], ["local-run", "--output-root", "/nonexistent/never-created"]):
        started = time.monotonic()
        assert commands.main(cifar10_pipeline, [*command, *arguments]) == 2
        assert message in capsys.readouterr().err and time.monotonic() - started < 30
    assert not kfp_api.bodies("POST", f"{API}/runs")


ROOT = ["--promotion-root", "s3://bucket/models"]


@pytest.mark.parametrize(
    ("arguments", "message", "used"),
    [
        (["--launcher", "pod", "--gpus-per-worker", "1"],
         "gpus_per_worker: a setting of a training job's worker pods, and launcher pod trains in the training step's "
         "own pod: leave it out, or set that pod with train_step_gpus",
         ["--launcher", "pod", "--train-step-gpus", "1"]),
        (["--launcher", "pod", "--worker-memory", "16Gi", "--queue-name", "team"],
         "worker_memory, queue_name: settings of a training job's worker pods", ["--launcher", "pod"]),
        (["--launcher", "pod", "--train-options", '{"job_timeout_seconds": 600}'],
         "train_options' job_timeout_seconds: a setting of a training job's worker pods",
         ["--launcher", "trainjob", "--train-options", '{"job_timeout_seconds": 600}']),
        (["--train-step-memory", "16Gi"],
         "train_step_memory: a setting of the training step's own pod, where only launcher pod trains; launcher auto "
         "trains in a training job: set its workers with gpus_per_worker, worker_cpu, worker_memory",
         ["--worker-memory", "16Gi"]),
        (["--launcher", "tfjob", "--train-step-gpus", "1", "--train-step-cpus", "8"],
         "train_step_gpus, train_step_cpus: settings of the training step's own pod", ["--launcher", "tfjob"]),
        (["--registered-model-name", "flowers"],
         "registered_model_name: names the model in a Model Registry, and no model_registry is given",
         ["--registered-model-name", "flowers", "--model-registry", "http://127.0.0.1:8080", *ROOT]),
        (["--serving-version", "2.21.0", "--warm-start-from-promoted", "true"],
         "serving_version, warm_start_from_promoted: settings of the promotion, and no promotion_root is given",
         ["--serving-version", "2.21.0", "--warm-start-from-promoted", "true", *ROOT]),
    ],
    ids=["job GPUs, pod", "job memory and queue, pod", "job timeout, pod", "pod memory, auto", "pod GPUs, tfjob",
         "model name, no registry", "promotion, no root"],
)  # fmt: skip
def test_a_setting_the_run_would_not_use_is_refused_and_the_way_it_names_is_taken(kfp_api, capsys, arguments,
                                                                                  message, used):  # fmt: skip
    """A setting that another one (or its default) makes the run ignore: a training job's worker pods with launcher
    pod, the training step's pod with a training job (launcher auto is one on a cluster), a Model Registry's model
    name without a registry, a promotion's settings without a root. Refused in one line before anything is
    submitted, saying what would use it; the way it names is submitted."""
    assert commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url, *arguments]) == 2
    assert message in capsys.readouterr().err
    assert not kfp_api.bodies("POST", f"{API}/runs")
    assert commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url, *used]) == 0
    assert len(kfp_api.bodies("POST", f"{API}/runs")) == 1


def test_a_local_run_keeps_its_own_promotion_root_for_the_promotions_settings():
    """A local run promotes into OUTPUT/models when no promotion_root is given: its promotion settings are used."""
    from pipeline.parameters import check_parameters

    check_parameters(cifar10_pipeline, {"serving_version": "2.21.0", "baseline_tolerance": 0.02}, on_cluster=False)
    with pytest.raises(commands.CommandError, match="no promotion_root is given"):
        check_parameters(cifar10_pipeline, {"serving_version": "2.21.0", "baseline_tolerance": 0.02})


def test_a_larger_bound_on_the_source_comes_with_the_memory_the_refusal_names(kfp_api, capsys):
    """max_source_megabytes raised alone lets in a source the prepare step's pod (8Gi) cannot hold: it would end
    OOMKilled, three times. The submission is refused naming the memory it needs; given that, the run carries both,
    and the compiled prepare step takes its memory request and limit from the parameter."""
    command = ["run", "--host", kfp_api.url, "--max-source-megabytes", "4096"]
    assert commands.main(cifar10_pipeline, command) == 2
    message = capsys.readouterr().err
    assert "prepare_step_memory: 8Gi is less than a source of up to 4,096 MB (max_source_megabytes) needs" in message
    memory = re.search(r"give prepare_step_memory (\S+) or more", message).group(1)
    assert not kfp_api.bodies("POST", f"{API}/runs")
    assert commands.main(cifar10_pipeline, [*command, "--prepare-step-memory", memory]) == 0
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    parameters = run["runtime_config"]["parameters"]
    assert (parameters["max_source_megabytes"], parameters["prepare_step_memory"]) == (4096, "32Gi")
    spec = next(yaml.safe_load_all(commands.COMPILED.read_text()))
    resources = spec["deploymentSpec"]["executors"]["exec-prepare-data-component"]["container"]["resources"]
    reference = "{{$.inputs.parameters['pipelinechannel--prepare_step_memory']}}"
    assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == reference
    assert spec["root"]["inputDefinitions"]["parameters"]["prepare_step_memory"]["defaultValue"] == "8Gi"


@pytest.mark.parametrize(
    ("pipeline_name", "parameters", "message"),
    [
        ("sweep", {"max_minutes": float("inf")}, "max_minutes: inf is not a finite number"),
        (
            "training",
            {"data_thresholds": {"channel_mean_shift": float("nan")}},
            "data_thresholds: channel_mean_shift is nan, which a run cannot carry",
        ),
        ("training", {"train_options": {"ema": [0.9, float("-inf")]}}, "train_options: ema[1] is -inf"),
        # kfp builds a parameter's value without null, and refuses it only once the run's steps have started
        ("training", {"train_options": {"ema_decay": None}}, "train_options: ema_decay is null, which a run cannot"),
        ("sweep", {"space": {"ema_decay": {"choices": [None, 0.999]}}}, "space: ema_decay.choices[0] is null"),
        # every number a run carries is a double: 2**53 + 1 would reach the step as 2**53
        ("training", {"train_options": {"lookahead_every_steps": 2**53 + 1}}, "lookahead_every_steps is 900719925"),
        ("training", {"warm_start_from_promoted": "yes"}, "warm_start_from_promoted: 'yes' is not true or false"),
        ("predict", {"top_k": True}, "top_k: True is not a whole number"),
        ("predict", {"model": 7}, "model: 7 is not text"),
    ],
)
def test_every_pipeline_refuses_a_value_its_parameter_cannot_carry(pipeline_name, parameters, message):
    """Whichever way the values came (a config file, a schedule's defaults, the Python API), a value the KFP type
    cannot carry is one line before any run is made, not a protobuf traceback from the client."""
    from pipeline.parameters import CommandError, check_parameters
    from pipeline.predict_pipeline import predict_pipeline
    from pipeline.sweep_pipeline import cifar10_sweep

    pipeline = {"training": cifar10_pipeline, "sweep": cifar10_sweep, "predict": predict_pipeline}[pipeline_name]
    with pytest.raises(CommandError) as refused:
        check_parameters(pipeline, parameters)
    (name,) = parameters
    line = str(refused.value)
    assert line.startswith(f"{name}: ") and message in line and "\n" not in line


@pytest.mark.parametrize(
    ("pipeline_name", "arguments", "message"),
    [
        ("training", ["run", "--promotion-root", "outputs/models"], "promotion_root: 'outputs/models' is a path"),
        ("training", ["schedule", "--promotion-root", "/data/models"], "promotion_root: '/data/models' is a path"),
        ("training", ["run", "--source", "cifar-10-python.tar.gz"], "source: 'cifar-10-python.tar.gz' is a path"),
        ("training", ["run", "--warm-start", "outputs/run/model"], "warm_start: 'outputs/run/model' is a path"),
        ("sweep", ["run", "--sweep-dir", "outputs/sweep"], "sweep_dir: 'outputs/sweep' is a path"),
        ("predict", ["run", "--model", "outputs/models", "--images", "s3://bkb/i"], "model: 'outputs/models' is a"),
        ("predict", ["run", "--model", "s3://bkb/m", "--images", "new-images/"], "images: 'new-images/' is a path"),
    ],
)
def test_a_cluster_run_refuses_a_path_of_this_machine(kfp_api, capsys, pipeline_name, arguments, message):
    """A cluster run's steps are pods: a path of the submitting machine is not in them, and one they write to (a
    promotion root) is gone with the pod, each run promoting "version 1" again and losing it. Refused in one line
    naming the parameter and what it may be, nothing submitted; a local run takes the same paths."""
    from pipeline.predict_pipeline import predict_pipeline
    from pipeline.sweep_pipeline import cifar10_sweep

    pipeline = {"training": cifar10_pipeline, "sweep": cifar10_sweep, "predict": predict_pipeline}[pipeline_name]
    command, *options = arguments
    extra = ["--cron", "0 0 3 * * *"] if command == "schedule" else []
    assert commands.main(pipeline, [command, "--host", kfp_api.url, *extra, *options]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line and "give a gs:// or s3://" in line, line
    assert not kfp_api.bodies("POST", f"{API}/runs") and not kfp_api.bodies("POST", f"{API}/recurringruns")


@pytest.mark.parametrize(
    ("pipeline_name", "arguments", "message"),
    [("training", ["run", "--promotion-root", "s3:///models"], "promotion_root: 's3:///models' names no bucket"),
     ("training", ["run", "--model-dir", "s3://bucket/../other"], "model_dir: 's3://bucket/../other': an object store"),
     ("training", ["schedule", "--promotion-root", "gs://bkb/models\n"], "holds a control character"),
     ("training", ["run", "--source", "s3://bkb/./cifar.tar.gz"], "an object store has no folders"),
     ("sweep", ["run", "--sweep-dir", "s3://bkb/sweeps/\x1b[2J"],
      "sweep_dir: 's3://bkb/sweeps/\\x1b[2J' holds a control"),
     ("predict", ["run", "--model", "s3:///m", "--images", "s3://bkb/i"], "model: 's3:///m' names no bucket"),
     # by the stores' own rules: bucket names, empty segments, a query, the key's length, Unicode line separators
     ("training", ["run", "--promotion-root", "s3://Bucket_Name/m"], "'Bucket_Name' is not a s3:// bucket name"),
     ("training", ["run", "--promotion-root", "s3://b/m"], "'b' is not a s3:// bucket name"),
     ("training", ["run", "--source", "s3://" + "a" * 64 + "/d.tar.gz"], "is not a s3:// bucket name"),
     ("training", ["run", "--model-dir", "gs://Bucket/m"], "'Bucket' is not a gs:// bucket name"),
     ("training", ["run", "--promotion-root", "s3://bkb/a//m"], "has an empty segment ('//')"),
     ("training", ["run", "--source", "s3://bkb/d.tar.gz?versionId=3"], "has a query or fragment"),
     ("training", ["run", "--promotion-root", "s3://bkb/" + "k" * 2000], "its key is 2,000 bytes"),
     ("training", ["run", "--promotion-root", "s3://bkb/a\u2028b"], "holds a control character"),
     ("training", ["run", "--source", "https://user:secret-pass@example.org/d.tar.gz"],
      "'https://***@example.org/d.tar.gz' carries credentials in the URL")],
)  # fmt: skip
def test_every_location_is_checked_by_one_rule_before_anything_is_sent(kfp_api, capsys, pipeline_name, arguments,
                                                                        message):  # fmt: skip
    """A bucket, no '..' or '.' in an object's key, no control character: for every location parameter, on every
    pipeline, refused in one line before the run (an object named '..' is not the folder above)."""
    from pipeline.predict_pipeline import predict_pipeline
    from pipeline.sweep_pipeline import cifar10_sweep

    pipeline = {"training": cifar10_pipeline, "sweep": cifar10_sweep, "predict": predict_pipeline}[pipeline_name]
    command, *options = arguments
    extra = ["--cron", "0 0 3 * * *"] if command == "schedule" else []
    assert commands.main(pipeline, [command, "--host", kfp_api.url, *extra, *options]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line, line
    assert not kfp_api.bodies("POST", f"{API}/runs") and not kfp_api.bodies("POST", f"{API}/recurringruns")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["run", "--run-name", "r" * 256], "run_name: 256 characters, more than the KFP API keeps (255)"),
     (["run", "--experiment", "e" * 129], "experiment: 129 characters, more than the KFP API keeps (128)"),
     (["schedule", "--cron", "0 0 3 * * *", "--name", "nightly\nretraining"], "name: 'nightly\\nretraining' holds a"),
     (["run", "--run-name", "   "], "run_name: an empty name")],
)  # fmt: skip
def test_names_are_bounded_as_the_kfp_api_bounds_them_before_anything_is_sent(kfp_api, capsys, arguments, message):
    command, *options = arguments
    assert commands.main(cifar10_pipeline, [command, "--host", kfp_api.url, *options]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line, line
    assert not kfp_api.bodies("POST", f"{API}/runs") and not kfp_api.bodies("POST", f"{API}/recurringruns")


def test_launcher_pod_with_more_workers_than_its_pod_holds_is_refused_before_the_run(kfp_api, capsys):
    """launcher pod trains as processes of the training step's own pod: 32 workers of half a GB each do not fit its
    8Gi (the pod would be OOMKilled, and retried, after the data was prepared)."""
    arguments = ["run", "--host", kfp_api.url, "--source", "s3://bkb/cifar.tar.gz", "--launcher", "pod",
                 "--workers", "32", "--train-step-memory", "8Gi"]  # fmt: skip
    assert commands.main(cifar10_pipeline, arguments) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        "workers: 32 training processes on the training step's pod (launcher pod; train_step_memory 8Gi) need at "
        "least 16.0 GB"
        in line
        and line.endswith("give at most 16")
    ), line
    assert not kfp_api.bodies("POST", f"{API}/runs")
    assert commands.main(cifar10_pipeline, [*arguments[:-1], "16Gi"]) == 0


def test_make_local_run_takes_epochs_or_train_steps_alone():
    with_epochs = make("-n", "local-run", EPOCHS="1").stdout
    assert "--epochs 1" in with_epochs and "--train-steps" not in with_epochs
    with_steps = make("-n", "local-run", TRAIN_STEPS="50").stdout
    assert "--train-steps 50" in with_steps and "--epochs" not in with_steps
    demo = make("-n", "local-run").stdout
    assert "--train-steps 300" in demo and '"batch_norm_decay": 0.9' in demo


def test_the_predict_pipeline_is_submitted_and_scheduled_with_its_own_package(kfp_api, tmp_path):
    """Batch prediction on a schedule: the promoted model scores a prefix; the training pipeline's package is
    untouched and none of its checks or schedule defaults apply."""
    from pipeline.predict_pipeline import predict_pipeline

    before = commands.COMPILED.read_bytes()
    model, images = "s3://bucket/models", "s3://bucket/incoming/"
    assert commands.main(predict_pipeline, ["run", "--host", kfp_api.url, "--model", model, "--images", images]) == 0
    assert commands.main(
        predict_pipeline,
        ["schedule", "--host", kfp_api.url, "--cron", "0 0 4 * * *", "--model", model, "--images", images,
         "--top-k", "5"],
    ) == 0  # fmt: skip
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    assert run["runtime_config"]["parameters"] == {"model": model, "images": images}
    (recurring,) = kfp_api.bodies("POST", f"{API}/recurringruns")
    assert recurring["runtime_config"]["parameters"] == {"model": model, "images": images, "top_k": 5}
    assert recurring["display_name"] == "cifar10-predict-scheduled"
    assert recurring["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "cifar10-predict"
    assert commands.COMPILED.read_bytes() == before
    fresh = commands.compile_pipeline(predict_pipeline, tmp_path / "predict.yaml")
    current = commands.compiled_path(predict_pipeline)
    assert [line for line in fresh.read_text().splitlines() if "sdkVersion" not in line] == [
        line for line in current.read_text().splitlines() if "sdkVersion" not in line
    ], "pipeline/predict.yaml is stale: run make compile"


def images_in(body: dict) -> set[str]:
    executors = body["pipeline_spec"]["pipeline_spec"]["deploymentSpec"]["executors"]
    return {executor["container"]["image"] for executor in executors.values()}


def test_run_submits_the_images_make_compile_named_and_leaves_the_compiled_file_alone(kfp_api, tmp_path, monkeypatch,
                                                                                        capsys):  # fmt: skip
    """make compile REGISTRY=... then make run: the run names the registry compile wrote, not the default."""
    from components import images

    compiled = tmp_path / "pipeline.yaml"
    monkeypatch.setitem(commands.COMPILED_FILES, "cifar10-pipeline", compiled)
    ran = subprocess.run(
        [sys.executable, "-m", "pipeline.make", "compile", "REGISTRY=registry.example.com/ml", "--print"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert "CIFAR10_PIPELINE_REGISTRY=registry.example.com/ml python -m pipeline.pipeline compile" in ran.stdout
    # what that compile writes (here into a scratch file; this process's components name the default registry)
    commands.compile_pipeline(cifar10_pipeline, compiled)
    compiled.write_text(compiled.read_text().replace(images.DEFAULT_REGISTRY + "/", "registry.example.com/ml/"))
    before = compiled.read_bytes()
    assert commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url, "--source", "s3://bkb/data.tar.gz"]) == 0
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    tag = images.image_tag()
    assert images_in(run) == {f"registry.example.com/ml/{kind}:{tag}" for kind in ("cpu", "gpu")}
    assert compiled.read_bytes() == before
    assert (
        f"images: registry.example.com/ml/cpu:{tag} and gpu:{tag} (REGISTRY as make compile wrote pipeline.yaml)"
        in (capsys.readouterr().err)
    )


@pytest.mark.parametrize(
    ("compiled_tag", "submitted"),
    [("v1", "v1"), ("0.1.0-0123456789ab", None)],  # a tag TAG gave; an older code's content tag
)
def test_run_submits_the_tag_make_compile_was_given_and_not_an_older_codes(kfp_api, tmp_path, monkeypatch, capsys,
                                                                           compiled_tag, submitted):  # fmt: skip
    """make compile REGISTRY=... TAG=v1 then make run: the run names v1 as compile wrote it, where a content tag in
    the compiled file is older code's: the run names this code's, and says the compiled file is out of date."""
    from components import images

    compiled = tmp_path / "pipeline.yaml"
    monkeypatch.setitem(commands.COMPILED_FILES, "cifar10-pipeline", compiled)
    commands.compile_pipeline(cifar10_pipeline, compiled)
    tag = images.image_tag()
    text = compiled.read_text()
    for kind in images.KINDS:
        text = text.replace(f"{images.DEFAULT_REGISTRY}/{kind}:{tag}", f"r.example.com/{kind}:{compiled_tag}")
    compiled.write_text(text)
    assert commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url, "--source", "s3://bkb/data.tar.gz"]) == 0
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    submitted = submitted or tag
    assert images_in(run) == {f"r.example.com/{kind}:{submitted}" for kind in ("cpu", "gpu")}
    said = capsys.readouterr().err
    older = f"pipeline.yaml was compiled from other code (tag {compiled_tag}); this submission names tag {tag}"
    if submitted == compiled_tag:
        assert "(REGISTRY and TAG as make compile wrote pipeline.yaml)" in said and older not in said
    else:
        assert "(REGISTRY as make compile wrote pipeline.yaml)" in said and older in said


def test_run_without_a_source_says_which_data_it_trains_on(kfp_api, capsys):
    assert commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url]) == 0
    (run,) = kfp_api.bodies("POST", f"{API}/runs")
    assert "source" not in run["runtime_config"]["parameters"]
    (line,) = [line for line in capsys.readouterr().err.splitlines() if " source: " in line]
    assert "cifar-10-python.tar.gz (the pipeline's default; SOURCE=... for your data)" in line


def test_a_schedule_of_the_same_name_is_refused_replaced_listed_and_disabled(kfp_api, capsys):
    schedule = ["schedule", "--host", kfp_api.url, "--cron", "0 0 3 * * *", "--promotion-root", "s3://bkb/models"]
    assert commands.main(cifar10_pipeline, schedule) == 0
    (first,) = kfp_api.recurring_runs
    assert commands.main(cifar10_pipeline, [*schedule, "--epochs", "2"]) == 2
    refusal = capsys.readouterr().err
    assert "a schedule named cifar10-pipeline-retraining exists" in refusal and "REPLACE=1" in refusal
    assert list(kfp_api.recurring_runs) == [first]
    assert commands.main(cifar10_pipeline, [*schedule, "--epochs", "2", "--replace"]) == 0
    (second,) = kfp_api.recurring_runs
    assert second != first and kfp_api.recurring_runs[second]["runtime_config"]["parameters"]["epochs"] == 2
    assert commands.main(cifar10_pipeline, [*schedule, "--name", "weekly"]) == 0
    capsys.readouterr()
    listing = ["schedules", "--host", kfp_api.url]
    assert commands.main(cifar10_pipeline, [*listing, "--disable", "weekly"]) == 0
    messages = [
        line.split(" pipeline: ", 1)[1] for line in capsys.readouterr().err.splitlines() if " pipeline: " in line
    ]
    listed = {line.split()[0]: line.split()[2] for line in messages if "cron" in line}
    assert listed == {"cifar10-pipeline-retraining": "ENABLED", "weekly": "DISABLED"}
    assert commands.main(cifar10_pipeline, [*listing, "--delete", "weekly"]) == 0
    assert [run["display_name"] for run in kfp_api.recurring_runs.values()] == ["cifar10-pipeline-retraining"]
    assert commands.main(cifar10_pipeline, [*listing, "--enable", "nightly"]) == 2
    assert "no schedule is named nightly" in capsys.readouterr().err


@pytest.mark.parametrize(("outcome", "code"), [("SUCCEEDED", 0), ("FAILED", 1)])
def test_run_wait_keeps_its_exit_code_without_make(outcome, code, tmp_path):
    """make turns a failure into its own 2; the same target through python -m pipeline.make keeps the run's code."""
    with FakeKfpApi(run_outcome=outcome) as api:
        ran = subprocess.run(
            [sys.executable, "-m", "pipeline.make", "run", f"KFP_HOST={api.url}", "WAIT=1", "SOURCE=s3://bkb/d.tar.gz",
             "EXTRA=--poll-seconds 0.1",
            ],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
    assert ran.returncode == code, ran.stderr[-2000:]
    assert ("failed at task launch-training-job-component" in ran.stderr) == (code == 1)
