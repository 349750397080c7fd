"""The pipeline: runs whole through kfp.local, compiles to the committed YAML, is submitted and scheduled as asked."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from components import images
from components.common.dataset import open_dataset
from components.evaluate.pointer import read_ready
from components.images import image
from components.train.launch_config import LaunchConfig
from pipeline import commands, local_run
from pipeline.parameters import CommandError
from pipeline.training_pipeline import cifar10_pipeline
from tests.builders import refused_port

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


def as_options(parameters: dict) -> list[str]:
    options = []
    for name, value in parameters.items():
        options += ["--" + name.replace("_", "-"), json.dumps(value) if isinstance(value, dict) else str(value)]
    return options


def test_whole_pipeline_runs_locally_with_two_workers_then_retrains_from_the_promoted_model(tmp_path, capsys):
    run = local_run.local_run(cifar10_pipeline, SMALL, tmp_path)

    (manifest,) = run.glob("prepare-data-component/dataset/manifest.json")
    verified = open_dataset(str(manifest.parent))
    assert verified.manifest.synthetic and verified.manifest.splits["train"].num_examples == 200  # all: no hold-out
    (model_dir,) = run.glob(f"{local_run.TRAINING_TASKS}/model")
    assert (model_dir / "ckpt-40.index").exists()
    trained = json.loads((model_dir / "train_metrics.json").read_text())
    assert trained["step"] == 40 and 0 < trained["metrics"]["loss"] < 5
    assert json.loads((model_dir / "config.json").read_text())["resolved"]["replicas"] == 2
    evaluation = json.loads((model_dir / "eval_metrics.json").read_text())
    assert 0.3 <= evaluation["metrics"]["accuracy"] <= 1.0 and evaluation["blessed"] is True
    (evaluated,) = run.glob("evaluate-component*")
    report = (evaluated / "report").read_text()
    assert "Confusion matrix" in report and "data:image/png;base64," in report
    executed = json.loads((evaluated / "executor_output.json").read_text())["artifacts"]
    (metrics,) = executed["metrics"]["artifacts"]
    assert metrics["metadata"]["accuracy"] == evaluation["metrics"]["accuracy"] and metrics["metadata"]["blessed"] == 1
    (classification,) = executed["classification"]["artifacts"]
    matrix = classification["metadata"]["confusionMatrix"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == verified.manifest.label_names
    assert sum(sum(row["row"]) for row in matrix["rows"]) == verified.manifest.splits["eval"].num_examples
    pointer = read_ready(str(tmp_path / "models"))
    assert pointer["step"] == 40 and Path(pointer["saved_model"], "saved_model.pb").exists()
    assert pointer["version"] == 1 and Path(pointer["saved_model"]) == tmp_path / "models" / "1"
    (promoted,) = run.glob("promote-component*")
    promoted_outputs = json.loads((promoted / "executor_output.json").read_text())
    (model_artifact,) = promoted_outputs["artifacts"]["promoted"]["artifacts"]
    assert model_artifact["metadata"]["saved_model"] == pointer["saved_model"]
    assert promoted_outputs["parameterValues"]["Output"] == 1
    (ui_metadata,) = run.glob(f"{local_run.TRAINING_TASKS}/mlpipeline_ui_metadata")
    assert json.loads(ui_metadata.read_text())["outputs"] == []  # no KFP viewer reads a local folder: no button
    (note,) = run.glob(f"{local_run.TRAINING_TASKS}/tensorboard")  # a Markdown output: how to open the logs
    assert f"make tensorboard LOGDIR={model_dir}" in note.read_text()

    # What a person saw: a line as each step starts and ends, the chief's progress; the log file has the rest.
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) <= 33, "\n".join(shown)  # 3 of them the data check's: started, its summary, done
    assert any("check the data: data check against none" in line for line in shown)
    assert any(line.endswith("train: step 40/40") or " train: step 40/40 " in line for line in shown), shown
    assert any(line.endswith("prepare data: done") for line in shown) and any("promote: done" in line for line in shown)
    log = (run / local_run.RUN_LOG).read_text()
    for noise in ("executor_input", "[worker-1]", "Traceback", "E0000", "UserWarning", "ERROR"):
        assert not [line for line in shown if noise in line], (noise, shown)
    assert "executor_input" in log and "[worker-1]" in log
    assert not [line for line in log.splitlines() if "StartAbort" in line or "E0000" in line]  # workers leave together

    # Two scheduled runs at once into the same output folder: same source (its dataset is reused, not prepared
    # again), each warm-started from whatever is promoted when it runs; each knows its own folder and succeeds,
    # whichever promotes first (the other decides again against it).
    command = [sys.executable, "-m", "pipeline.pipeline", "local-run", "--output-root", str(tmp_path),
               *as_options({**SMALL, "warm_start_from_promoted": True, "train_steps": 10, "workers": 1})]  # fmt: skip
    runs = [subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    outputs = [process.communicate(timeout=600) for process in runs]
    folders = []
    for process, (out, err) in zip(runs, outputs, strict=True):
        assert process.returncode == 0, out[-3000:] + err[-3000:]
        (folder,) = set(re.findall(r"finished in \d+ s: (\S+)", err))
        assert f"full log: {folder}/{local_run.RUN_LOG}" in err
        assert "prepare data: reused" in out and not Path(folder, "prepare-data-component").exists()
        folders.append(folder)
        (second_model,) = Path(folder).glob(f"{local_run.TRAINING_TASKS}/model")
        # ... from the promoted version's own copy of its checkpoint, which outlives the first run's model directory.
        assert json.loads((second_model / "config.json").read_text())["warm_start"] == pointer["warm_start"]
    assert folders[0] != folders[1]
    assert pointer["warm_start"] == str(tmp_path / "models" / "1" / "checkpoint" / "ckpt-40")
    final = read_ready(str(tmp_path / "models"))
    assert final["state"] == "ready" and Path(final["saved_model"], "saved_model.pb").exists()


def compiled_without_version(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if "sdkVersion" not in line]


def test_compiled_yaml_is_current(tmp_path):
    fresh = commands.compile_pipeline(cifar10_pipeline, tmp_path / "pipeline.yaml")
    assert compiled_without_version(fresh) == compiled_without_version(commands.COMPILED), (
        "pipeline/pipeline.yaml is stale: run make compile"
    )


def test_each_stages_published_component_yaml_is_current(tmp_path):
    written = commands.compile_components(tmp_path)
    assert [path.relative_to(tmp_path).as_posix() for path in written] == list(images.PUBLISHED_COMPONENT_FILES)
    for fresh in written:
        published = commands.COMPONENTS_ROOT / fresh.relative_to(tmp_path)
        assert published.is_file() and compiled_without_version(fresh) == compiled_without_version(published), (
            f"{published} is stale: run make compile"
        )


def test_another_pipeline_reuses_a_published_stage_from_its_yaml(tmp_path):
    """What docs/development.md shows: load a stage's component.yaml into one's own pipeline (run by kfp.local)."""
    from kfp import local

    from tests.another_pipeline import from_a_prepared_dataset, my_pipeline, prepared_only

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    assert my_pipeline().output == 30
    dataset = prepared_only().output  # an existing prepared dataset, imported (dsl.importer) instead of prepared
    assert from_a_prepared_dataset(dataset_uri=dataset.uri).output == 20


def compiled() -> tuple[dict, dict]:
    documents = list(yaml.safe_load_all(commands.COMPILED.read_text()))
    return documents[0], documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def fan_out_spec() -> dict:
    """The training pipeline compiled with --prepare-fan-out (its IR)."""
    from kfp import compiler

    from pipeline.training_pipeline import with_prepare_fan_out

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fan-out.yaml"
        compiler.Compiler().compile(with_prepare_fan_out(cifar10_pipeline), str(path))
        return next(yaml.safe_load_all(path.read_text()))


def dags(spec: dict) -> dict[str, dict]:
    """Every DAG of the compiled pipeline (the root, the dsl.If branches, the sub-pipelines), by component name."""
    return {"root": spec["root"], **{name: c for name, c in spec["components"].items() if "dag" in c}}


def tasks_of(spec: dict, component_prefix: str) -> list[tuple[str, dict, str]]:
    """(DAG, task, executor label) of every task whose component's name starts with `component_prefix`."""
    found = []
    for dag_name, component in dags(spec).items():
        for task in component["dag"]["tasks"].values():
            name = task["componentRef"]["name"]
            if name.startswith(component_prefix):
                found.append((dag_name, task, spec["components"][name].get("executorLabel")))
    return found


def _parameter_references(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "componentInputParameter"] + [
            reference
            for k, v in node.items()
            if k != "componentInputParameter"
            for reference in _parameter_references(v)
        ]
    if isinstance(node, list):
        return [reference for item in node for reference in _parameter_references(item)]
    return []


def test_every_parameter_a_task_reads_is_declared_by_its_dag():
    """What the backend's driver resolves: a task (and its Kubernetes settings: secret names...) can only read
    parameters its own DAG declares. The KFP compiler drops resource parameters used inside dsl.If branches."""
    spec, platform = compiled()
    problems = []
    for dag_name, component in dags(spec).items():
        definitions = component.get("inputDefinitions", {})
        declared = set(definitions.get("parameters", {})) | set(definitions.get("artifacts", {}))
        for task_name, task in component["dag"]["tasks"].items():
            reads = _parameter_references(task.get("inputs", {}))
            reads += [
                source["componentInputArtifact"]
                for source in task.get("inputs", {}).get("artifacts", {}).values()
                if "componentInputArtifact" in source
            ]
            executor = spec["components"][task["componentRef"]["name"]].get("executorLabel")
            reads += _parameter_references(platform.get(executor, {}))
            problems += [f"{dag_name}/{task_name} reads {name!r}" for name in reads if name not in declared]
    assert problems == []


def test_caching_retries_resources_and_tolerations_in_the_compiled_pipeline():
    spec, platform = compiled()
    caching = {
        task["componentRef"]["name"]: task.get("cachingOptions", {}).get("enableCache", False)
        for component in dags(spec).values()
        for task in component["dag"]["tasks"].values()
        if "executorLabel" in spec["components"][task["componentRef"]["name"]]
    }
    assert {name for name, cached in caching.items() if cached} == {"comp-prepare-data-component"}  # keyed on data
    fanned_out = fan_out_spec()
    for prepares in ("comp-prepare-data-component", "comp-prepare-part-component"):
        (prepare,) = tasks_of(fanned_out, prepares)
        assert prepare[1]["cachingOptions"]["enableCache"] is True  # the parts are keyed on the data too
        prepare_inputs = prepare[1]["inputs"]["parameters"]
        reference = prepare_inputs["source_fingerprint"]  # a worker inside the ParallelFor gets it as a loop input
        fingerprint = (
            reference.get("taskOutputParameter", {}).get("producerTask") or reference["componentInputParameter"]
        )
        assert fingerprint.removeprefix("pipelinechannel--").startswith("source-fingerprint-component"), prepares
    executors = spec["deploymentSpec"]["executors"]

    trains = tasks_of(spec, "comp-train-component") + tasks_of(spec, "comp-launch-training-job-component")
    assert len(trains) == 3  # on GPUs, on CPUs, as a training job: exactly one runs
    for _dag, task, executor in trains:
        assert task["retryPolicy"]["maxRetryCount"] >= 2 and "train" in task["taskInfo"]["name"]
        assert int(platform[executor]["activeDeadlineSeconds"]) >= 7 * 24 * 3600  # stuck steps end
    promotions = tasks_of(spec, "comp-promote-component")
    assert promotions and all(task["retryPolicy"]["maxRetryCount"] >= 2 for _dag, task, _ in promotions)
    gpu_trains = [executor for dag, _task, executor in trains if dag == "comp-train-on-gpus"]
    assert len(gpu_trains) == 1
    for _dag, _task, executor in trains:
        container = executors[executor]["container"]
        tolerations = platform.get(executor, {}).get("tolerations", [])
        if executor in gpu_trains:
            assert container["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
            assert [t["key"] for t in tolerations] == ["nvidia.com/gpu"]
        else:
            assert "accelerator" not in container.get("resources", {}) and tolerations == [], executor
    (launch,) = tasks_of(spec, "comp-launch-training-job-component")
    # The launching step times out after the job's own timeout, so that it deletes its job itself.
    assert int(platform[launch[2]]["activeDeadlineSeconds"]) > LaunchConfig().job_timeout_seconds
    (cleanup,) = [
        task for task in spec["root"]["dag"]["tasks"].values() if "delete-training" in task["componentRef"]["name"]
    ]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"  # runs however the run ended
    assert executors[launch[2]]["container"]["image"] == image("launcher")  # the CPU image, no GPU libraries
    for name in executors:
        if "train-component" not in name:
            assert not platform.get(name, {}).get("tolerations"), f"{name} is CPU-only and must not tolerate GPUs"
        if "delete-training-job" not in name:  # the exit handler touches no object store
            assert platform[name]["secretAsEnv"][0]["optional"] is True  # object-store keys, when the secret exists
        assert "imagePullSecret" in platform[name], name  # every step can pull from a private registry
    worker_image = spec["root"]["inputDefinitions"]["parameters"]["worker_image"]["defaultValue"]
    assert worker_image == image("train")  # the workers run the image the pipeline was compiled with


def test_every_pipeline_parameter_has_a_description_shown_in_help():
    spec, _platform = compiled()
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    missing = [name for name, definition in parameters.items() if not definition.get("description")]
    assert missing == []
    run_help = subprocess.run(
        [sys.executable, "-m", "pipeline.pipeline", "run", "--help"], capture_output=True, text=True, cwd=REPOSITORY
    ).stdout
    assert "Training job: GPUs of each worker pod" in " ".join(run_help.split())


def test_docker_runner_without_an_engine_says_why_and_what_to_do_instead(tmp_path):
    if local_run.docker_engine_problem() is None:
        pytest.skip("a Docker engine answers on this machine, so the DockerRunner would really run")
    with pytest.raises(CommandError, match=r"RUNNER=docker needs a running Docker engine.*make local-run"):
        local_run.local_run(cifar10_pipeline, SMALL, tmp_path, runner="docker")


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


def test_every_compiled_component_program_runs_on_its_own(tmp_path):
    """KFP runs a lightweight component's source alone (its module's other names undefined): a default such as
    `image("train")` in a signature fails there with a NameError before the step does anything. Load each compiled
    program the way the KFP executor does and check it defines its function."""
    import runpy

    spec, _platform = compiled()
    loaded = []
    for label, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        if "--function_to_execute" not in container.get("args", []):
            continue
        function = container["args"][container["args"].index("--function_to_execute") + 1]
        program = tmp_path / f"{label}.py"
        program.write_text(container["command"][-1])
        namespace = runpy.run_path(str(program))
        assert callable(namespace.get(function)), f"{label}: {function} is not defined by its program"
        loaded.append(function)
    assert {"train_component", "launch_training_job_component", "prepare_data_component", "evaluate_component",
            "delete_training_job_component"} <= set(loaded)  # fmt: skip


def test_component_and_pipeline_defaults_are_the_configs_defaults():
    """Defaults live in the config dataclasses; a component's are literals (see the test above), so they are checked
    here: every parameter that names a config field defaults to that field's default (or its not-given value)."""
    import inspect

    from components.common.kfp_parameters import parameter_defaults
    from components.evaluate.component import evaluate_component
    from components.evaluate.config import EvaluateConfig
    from components.prepare_data.component import prepare_data_component
    from components.prepare_data.config import PrepareDataConfig
    from components.train.component import launch_training_job_component, train_component
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig

    # the pipeline's and the job step's own, said where they are set
    own_choices = {"workers", "accuracy_threshold", "worker_image", "validation_fraction"}
    checked = []
    prepare, train, launch, evaluate = (
        vars(parameter_defaults(c)) for c in (PrepareDataConfig, TrainConfig, LaunchConfig, EvaluateConfig)
    )
    for function, defaults in (
        (prepare_data_component.python_func, prepare),
        (train_component.python_func, train),
        (launch_training_job_component.python_func, {**train, **launch}),
        (evaluate_component.python_func, evaluate),
        (cifar10_pipeline.pipeline_func, {**evaluate, **train, **launch, **prepare}),  # batch_size is the training's
    ):
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.default is inspect.Parameter.empty or name not in defaults:
                continue  # an artifact (model, dataset) or a parameter of the KFP step only
            if not (name in own_choices and function is not train_component.python_func):
                assert parameter.default == defaults[name], f"{function.__name__}({name}): {parameter.default!r}"
                checked.append(name)
    assert {"depth", "train_steps", "epochs", "warm_start", "baseline"} <= set(checked)


def test_the_train_steps_parameters_are_one_list():
    """The train component's signature is the list: the job-launching component takes every one of them, each training
    sub-pipeline declares exactly them (and its pod's settings) and passes them all to its train task, and the
    pipeline has a parameter for each (`options` is its train_options; `warm_start` comes from its warm-start step)."""
    import inspect

    from components.train.component import launch_training_job_component
    from pipeline.training_pipeline import TRAINING

    assert {"dataset", "model_dir", "preset", "workers", "depth", "epochs", "options"} <= set(TRAINING)
    assert set(TRAINING) <= set(inspect.signature(launch_training_job_component.python_func).parameters)
    pipeline_parameters = set(inspect.signature(cifar10_pipeline.pipeline_func).parameters)
    assert set(TRAINING) - {"dataset", "options"} <= pipeline_parameters and "train_options" in pipeline_parameters
    spec, _platform = compiled()
    for sub_pipeline in ("comp-train-on-cpus", "comp-train-on-gpus"):
        component = spec["components"][sub_pipeline]
        definitions = component["inputDefinitions"]
        declared = set(definitions["parameters"]) | set(definitions["artifacts"])
        assert declared - set(TRAINING) <= {"cpus", "memory", "gpus", "object_store_secret", "image_pull_secret"}
        (task,) = [task for task in component["dag"]["tasks"].values() if task["componentRef"]["name"].startswith(
            "comp-train-component")]  # fmt: skip
        passed = set(task["inputs"]["parameters"]) | set(task["inputs"]["artifacts"])
        resources = {"cpu_request", "memory_request", "memory_limit", "accelerator_count"}
        resources |= {f"pipelinechannel--{name}" for name in ("cpus", "memory", "gpus")}
        assert passed - resources == set(TRAINING) | {"run_id"}, sub_pipeline


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--source", "/no/such/cifar-10-python.tar.gz"], r"source: /no/such/cifar-10-python\.tar\.gz does not exist"),
        (["--source", f"http://127.0.0.1:{refused_port()}/cifar-10-python.tar.gz"],
         r"source: cannot reach 127\.0\.0\.1 .*download .* elsewhere and give its path: make local-run "
         r"SOURCE=/path/to/cifar-10-python\.tar\.gz"),
        (["--workers", "0"], r"workers: 0 is not in \[1, 4096\]"),
        (["--train-options", '{"learning_rat": 0.1}'], r"'learning_rat' \(did you mean 'learning_rate'"),
        (["--launcher", "tfjob"], r"launcher tfjob needs a Kubernetes cluster"),
        (["--resume", "last"], r"--resume last: no interrupted run in .* has a checkpoint or a search to continue"),
    ],
    ids=["missing source", "unreachable URL", "no workers", "misspelt option", "cluster launcher", "nothing to resume"],
)  # fmt: skip
def test_local_run_mistakes_fail_in_seconds_with_one_line_and_run_nothing(tmp_path, options, problem):
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.pipeline", "local-run", "--output-root", str(tmp_path / "out"), *options],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert completed.returncode == 2, output[-3000:]
    assert len(errors) == 1 and re.search(problem, errors[0]), output[-3000:]
    assert "Traceback" not in output and "Retrying" not in output
    assert time.monotonic() - started < 30
    assert not list((tmp_path / "out").glob("cifar10-pipeline-*"))  # no step ran


def test_the_pipelines_bound_on_the_source_reaches_the_prepare_step_and_its_refusal_says_how_to_raise_it(tmp_path):
    """max_source_megabytes goes from the command line through the compiled pipeline to the prepare step: a 1.5 MB
    archive, within the default bound, is refused with a bound of 1 MB, and the step's one line names the pipeline's
    parameters (not only the stage's own option, which a pipeline run cannot give)."""
    from tests import builders

    archive = builders.write_python_archive(tmp_path / "cifar-10-python.tar.gz", builders.official_data(per_batch=70))
    assert 1 << 20 < archive.stat().st_size < 2 << 20
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.pipeline", "local-run", "--output-root", str(tmp_path / "out"), "--source",
         str(archive), "--max-source-megabytes", "1"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-3000:]
    (refusal,) = [line for line in output.splitlines() if "prepare data: ERROR" in line]
    assert "1.5 MB is more than the limit of 1 MB" in refusal, refusal
    assert "in a pipeline, the max_source_megabytes parameter, with prepare_step_memory at 8 MB for each MB" in refusal
    assert "the run failed at prepare data" in output and not re.search(r"\btrain[^:\n]*: started", output)


def processes_of(folder: Path) -> list[str]:
    """The command lines of the processes that name `folder` (a run's steps, launchers and workers do)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if str(folder) in command and "zombie" not in state:
            found.append(f"{entry.name}: {command[:200]}")
    return found


ENDLESS = {**SMALL, "train_steps": 100_000, "train_options": {**SMALL["train_options"], "log_every_steps": 5}}


def start_endless_run(folder: Path, workers: int) -> tuple[subprocess.Popen, list[str]]:
    """`local-run` of a training that never ends, in a session of its own, read until its first progress line.

    A terminal's foreground job takes Ctrl-C with the default action, also when this suite runs as a background job
    (nohup, `make test &`), whose children start with SIGINT ignored and rightly keep ignoring it."""
    options = as_options(ENDLESS | {"workers": workers})
    run = subprocess.Popen(
        [sys.executable, "-m", "pipeline.pipeline", "local-run", "--output-root", str(folder), *options],
        cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines = []
    for line in run.stdout:
        lines.append(line)
        if re.search(r"train: step 5/100000 ", line):
            break
    return run, lines


def test_a_killed_local_run_leaves_no_process_of_the_run_behind(tmp_path):
    """kill -9 of local-run alone: its steps, the launcher and the workers stop (at a checkpoint), within a bound."""
    run, _lines = start_endless_run(tmp_path, workers=2)
    assert processes_of(tmp_path), "the run's steps are running"
    run.kill()
    run.wait(timeout=30)
    deadline = time.monotonic() + 180
    while processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(1)
    assert processes_of(tmp_path) == []
    (model_dir,) = list(tmp_path.glob(f"*/{local_run.TRAINING_TASKS}/model"))
    assert list(model_dir.glob("ckpt-*.index")), "the workers saved a checkpoint on the way out"


def test_ctrl_c_keeps_the_checkpoint_says_how_to_resume_and_resuming_continues_it(tmp_path):
    run, lines = start_endless_run(tmp_path, workers=1)
    endless = ENDLESS | {"workers": 1}
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C in its terminal: local-run passes it on to the steps it started
    lines.append(run.communicate(timeout=120)[0])
    output = "".join(lines)
    assert run.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "Retrying" not in output and "FAILED" not in output
    match = re.search(r"interrupted at step (\d+) \(its checkpoint is saved\); continue with: make local-run "
                      rf"OUTPUT={re.escape(str(tmp_path))} RESUME=(cifar10-pipeline-\S+) ", output)  # fmt: skip
    assert match, output[-3000:]
    assert processes_of(tmp_path) == [], "when the prompt returns, nothing of the run is still running"
    saved, name = int(match.group(1)), match.group(2)
    (model_dir,) = (tmp_path / name).glob(f"{local_run.TRAINING_TASKS}/model")
    assert (model_dir / f"ckpt-{saved}.index").exists()

    resumed = local_run.local_run(cifar10_pipeline, {**endless, "train_steps": saved + 5}, tmp_path, resume="last")
    assert resumed.name != name
    assert json.loads((model_dir / "train_metrics.json").read_text())["step"] == saved + 5
    assert re.search(rf"resuming from .*ckpt-{saved} at step {saved}", (resumed / local_run.RUN_LOG).read_text())


def test_a_bad_input_found_inside_a_step_ends_the_run_with_exit_2_naming_the_step(tmp_path):
    """Images of two sizes pass the source's quick check and are refused by the prepare step itself: the run exits
    2 (a setting to fix), as the step did, not 1 (a failure), and its last line names the step."""
    from PIL import Image

    source = tmp_path / "images"
    for split in ("train", "test"):
        for label, size in (("cat", 32), ("dog", 40)):
            (source / split / label).mkdir(parents=True)
            for index in range(12):
                Image.new("RGB", (size, size), (index * 20, 0, 0)).save(source / split / label / f"{index}.png")
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.pipeline", "local-run", "--output-root", str(tmp_path / "out"),
         "--source", str(source), "--train-steps", "2"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-3000:]
    assert "size" in output and "the run failed at prepare data" in output.strip().splitlines()[-1], output[-3000:]
