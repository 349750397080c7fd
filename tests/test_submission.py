"""`run` and `schedule` submit through the real kfp.Client to a strict stand-in of the KFP REST API (v2beta1);
the tests assert on what the backend receives: each task's own caching, the run and recurring-run settings."""

from __future__ import annotations

import pytest
import yaml

from pipeline import commands
from pipeline.pipeline import cifar10_pipeline
from tests.fake_kfp_api import API, FakeKfpApi, RefusedError, check_model


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
    assert cached == {"prepare-data-component"}, cached


def test_a_schedule_keeps_each_tasks_own_caching_and_runs_one_at_a_time(kfp_api):
    code = commands.main(
        cifar10_pipeline,
        ["schedule", "--host", kfp_api.url, "--cron", "0 30 2 * * *", "--promotion-root", "s3://bucket/models",
         "--epochs", "30", "--train-options", '{"ema_decay": 0.999}'],
    )  # fmt: skip
    assert code == 0

    (recurring,) = kfp_api.bodies("POST", f"{API}/recurringruns")
    assert recurring["display_name"] == "cifar10-pipeline-retraining"
    assert recurring["trigger"] == {"cron_schedule": {"cron": "0 30 2 * * *"}}
    assert int(recurring["max_concurrency"]) == 1 and recurring["no_catchup"] is True
    assert recurring["mode"] == "ENABLE"
    assert recurring["runtime_config"]["parameters"] == {
        "warm_start_from_promoted": True,
        "promotion_root": "s3://bucket/models",
        "epochs": 30.0,
        "train_options": {"ema_decay": 0.999},
    }
    assert _caching_of(recurring["pipeline_spec"]["pipeline_spec"]) == compiled_caching()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["schedule", "--cron", "0 3 * * *", "--promotion-root", "gs://b"],
            "has 5 fields; KFP's cron has six, seconds first",
        ),
        (["schedule", "--cron", "0 0 3 * * *"], "a schedule needs --promotion-root"),
    ],
)
def test_bad_submission_requests_are_clear_errors_and_send_nothing(kfp_api, capsys, arguments, message):
    assert commands.main(cifar10_pipeline, [arguments[0], "--host", kfp_api.url, *arguments[1:]]) == 2
    assert message in capsys.readouterr().err
    assert not kfp_api.bodies("POST", f"{API}/runs") and not kfp_api.bodies("POST", f"{API}/recurringruns")


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
