"""The pipeline: runs whole through kfp.local, compiles to the committed YAML, is submitted and scheduled as asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.common.dataset import open_dataset
from pipeline import commands
from pipeline.pipeline import cifar10_pipeline

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = {
    "source": "synthetic",
    "synthetic_train_per_class": 20,
    "workers": 2,
    "depth": 8,
    "batch_size": 32,
    "train_steps": 40,
    "accuracy_threshold": 0.3,
    "train_options": {"width_multiplier": 0.25, "log_every_steps": 10, "batch_norm_decay": 0.9},
}


def test_whole_pipeline_runs_locally_with_two_workers_then_retrains_from_the_promoted_model(tmp_path):
    run = commands.local_run(cifar10_pipeline, SMALL, tmp_path)

    (manifest,) = run.glob("prepare-data-component/dataset/manifest.json")
    verified = open_dataset(str(manifest.parent))
    assert verified.manifest.synthetic and verified.manifest.splits["train"].num_examples == 160
    (model_dir,) = run.glob("train-component/model")
    assert (model_dir / "ckpt-40.index").exists()
    trained = json.loads((model_dir / "train_metrics.json").read_text())
    assert trained["step"] == 40 and 0 < trained["metrics"]["loss"] < 5
    assert json.loads((model_dir / "config.json").read_text())["resolved"]["replicas"] == 2
    evaluation = json.loads((model_dir / "eval_metrics.json").read_text())
    assert 0.3 <= evaluation["metrics"]["accuracy"] <= 1.0 and evaluation["blessed"] is True
    report = (run / "evaluate-component" / "report").read_text()
    assert "Confusion matrix" in report and "data:image/png;base64," in report
    executed = json.loads((run / "evaluate-component" / "executor_output.json").read_text())["artifacts"]
    (metrics,) = executed["metrics"]["artifacts"]
    assert metrics["metadata"]["accuracy"] == evaluation["metrics"]["accuracy"] and metrics["metadata"]["blessed"] == 1
    (classification,) = executed["classification"]["artifacts"]
    matrix = classification["metadata"]["confusionMatrix"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == verified.manifest.label_names
    assert sum(sum(row["row"]) for row in matrix["rows"]) == verified.manifest.splits["eval"].num_examples
    pointer = json.loads((tmp_path / "models" / "current.json").read_text())
    assert pointer["step"] == 40 and Path(pointer["saved_model"], "saved_model.pb").exists()

    # A scheduled run: same source, warm-started from whatever is promoted at the time it runs.
    second = commands.local_run(
        cifar10_pipeline, {**SMALL, "warm_start_from_promoted": True, "train_steps": 10}, tmp_path
    )
    (second_model,) = second.glob("train-component/model")
    assert json.loads((second_model / "config.json").read_text())["warm_start"] == pointer["checkpoint"]


def compiled_without_version(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if "sdkVersion" not in line]


def test_compiled_yaml_is_current(tmp_path):
    fresh = commands.compile_pipeline(cifar10_pipeline, tmp_path / "pipeline.yaml")
    assert compiled_without_version(fresh) == compiled_without_version(commands.COMPILED), (
        "pipeline/pipeline.yaml is stale: run make compile"
    )


def test_caching_retries_and_resources_in_the_compiled_pipeline():
    documents = list(yaml.safe_load_all(commands.COMPILED.read_text()))
    spec, platform = documents[0], documents[1]
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["train-component"]["cachingOptions"] == {}  # never from cache: training must really run
    assert tasks["evaluate-component"]["cachingOptions"] == {}
    assert tasks["source-fingerprint-component"]["cachingOptions"] == {}
    assert tasks["prepare-data-component"]["cachingOptions"] == {"enableCache": True}  # keyed on the fingerprint
    prepare_inputs = tasks["prepare-data-component"]["inputs"]["parameters"]
    assert prepare_inputs["source_fingerprint"]["taskOutputParameter"]["producerTask"] == "source-fingerprint-component"
    for task in ("prepare-data-component", "train-component"):
        assert tasks[task]["retryPolicy"]["maxRetryCount"] >= 2
    executor = spec["deploymentSpec"]["executors"]["exec-train-component"]["container"]
    assert executor["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert executor["image"] == "ghcr.io/cifar10-pipeline/train:0.1.0"
    tolerations = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-component"]
    assert tolerations["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert tasks["train-component"]["taskInfo"]["name"] == "train"


def test_docker_runner_without_an_engine_says_why_and_what_to_do_instead(tmp_path):
    if commands.docker_engine_problem() is None:
        pytest.skip("a Docker engine answers on this machine, so the DockerRunner would really run")
    with pytest.raises(commands.CommandError, match=r"RUNNER=docker needs a running Docker engine.*make local-run"):
        commands.local_run(cifar10_pipeline, SMALL, tmp_path, runner="docker")


def test_every_pipeline_parameter_is_an_option_with_its_type():
    parser = commands.build_parser(cifar10_pipeline)
    arguments = parser.parse_args(
        ["local-run", "--train-steps", "5", "--learning-rate", "0.2", "--train-options", '{"ema_decay": 0.99}',
         "--warm-start-from-promoted", "true"]
    )  # fmt: skip
    assert commands.chosen_parameters(arguments, cifar10_pipeline) == {
        "train_steps": 5,
        "learning_rate": 0.2,
        "train_options": {"ema_decay": 0.99},
        "warm_start_from_promoted": True,
    }
