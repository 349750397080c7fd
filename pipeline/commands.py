"""The pipeline's commands: compile, local-run (kfp.local), run (submit to KFP), schedule, tensorboard.

Every pipeline parameter is an option of local-run, run and schedule (`--train-steps 200`), generated from
the pipeline's own signature so the two never drift apart.

Over 300 lines: one function per command (compile, local-run and its Docker runner, run, schedule, tensorboard) and
their shared parameter checks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any

from components.common import exit_codes
from components.common.logs import setup_logging

logger = logging.getLogger("pipeline")

# The compiled pipeline is package data (pyproject.toml), found beside this module however it was installed.
COMPILED = Path(str(resources.files("pipeline").joinpath("pipeline.yaml")))
DEFAULT_EXPERIMENT = "cifar10"


class CommandError(RuntimeError):
    """A command cannot do what was asked (no Docker engine, a bad cron expression...)."""


# -- parameters -----------------------------------------------------------------------------------------------


def _parameter_types(pipeline) -> dict[str, tuple[str, Any]]:
    """{name: (KFP type, default)} of the pipeline's inputs."""
    return {name: (spec.type, spec.default) for name, spec in pipeline.component_spec.inputs.items()}


def _descriptions(pipeline) -> dict[str, str]:
    """{name: description} of the pipeline's inputs (from its docstring's Args, as the KFP UI shows them)."""
    return {name: spec.description or "" for name, spec in pipeline.component_spec.inputs.items()}


def _converter(kfp_type: str):
    if kfp_type == "Boolean":
        from components.common.config import parse_bool

        return parse_bool
    if kfp_type == "Integer":
        return int
    if kfp_type == "Float":
        return float
    if kfp_type in ("Dict", "List"):
        return json.loads
    return str


def add_parameter_options(parser: argparse.ArgumentParser, pipeline) -> None:
    group = parser.add_argument_group("pipeline parameters (default: the pipeline's)")
    descriptions = _descriptions(pipeline)
    for name, (kfp_type, default) in _parameter_types(pipeline).items():
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"parameter_{name}",
            type=_converter(kfp_type),
            default=None,
            metavar=kfp_type.upper(),
            help=f"{descriptions[name]} (default: {json.dumps(default)})".replace("%", "%%"),
        )


def chosen_parameters(arguments: argparse.Namespace, pipeline) -> dict[str, Any]:
    return {
        name: getattr(arguments, f"parameter_{name}")
        for name in _parameter_types(pipeline)
        if getattr(arguments, f"parameter_{name}") is not None
    }


# -- checking parameters before anything runs ------------------------------------------------------------------

LAUNCHERS = ("auto", "trainjob", "tfjob", "pod")
# Pipeline parameters that become TrainConfig fields (and LaunchConfig fields) of the same name.
TRAIN_PARAMETERS = ("workers", "depth", "batch_size", "learning_rate", "train_steps", "epochs", "preset")
LAUNCH_PARAMETERS = ("gpus_per_worker", "worker_cpu", "worker_memory", "worker_image", "queue_name")
LAUNCH_PARAMETERS += ("object_store_secret",)


def check_parameters(pipeline, parameters: dict[str, Any]) -> None:
    """Refuse, in seconds and before any step runs, run parameters that the train step would refuse after the
    data was prepared: an unknown launcher, both epochs and train_steps, an option the train stage does not know
    or a value it refuses, a train option that repeats a named parameter, a bad worker setting."""
    from components.common.kfp_parameters import config_from_parameters
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig

    defaults = {name: default for name, (_kind, default) in _parameter_types(pipeline).items()}
    values = {**defaults, **parameters}
    if values["launcher"] not in LAUNCHERS:
        raise CommandError(f"launcher: {values['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
    options = dict(values.get("train_options") or {})
    named = {*TRAIN_PARAMETERS, *LAUNCH_PARAMETERS, "warm_start", "model_dir", "data", "launcher"}
    repeated = sorted(set(options) & named)
    if repeated:
        raise CommandError(f"train_options: {repeated} are pipeline parameters; set them as such, not in train_options")
    train = {name: values[name] for name in TRAIN_PARAMETERS}
    job = values["launcher"] in ("trainjob", "tfjob")
    location = "s3://check/" if job else "/check/"
    train.update(data=location + "data", model_dir=location + "model", launcher="auto" if not job else "trainjob")
    train.update(options)
    launch = {name: values[name] for name in LAUNCH_PARAMETERS}
    secret = values.get("image_pull_secret") or ""
    launch["image_pull_secrets"] = (secret,) if secret else ()
    try:
        config_from_parameters(TrainConfig, train, "pipeline parameters")
        config_from_parameters(LaunchConfig, launch, "pipeline parameters")
    except ValueError as error:
        raise CommandError(str(error)) from error


# -- compile ----------------------------------------------------------------------------------------------------


def compile_pipeline(pipeline, output: Path = COMPILED) -> Path:
    from kfp import compiler

    compiler.Compiler().compile(pipeline, str(output))
    logger.info("compiled %s", output)
    return output


# -- local-run --------------------------------------------------------------------------------------------------


def docker_engine_problem() -> str | None:
    """Why a DockerRunner cannot work here, or None when a Docker API answers (Docker's, or podman's
    `podman system service` with DOCKER_HOST pointing at its socket)."""
    try:
        import docker

        docker.from_env(timeout=20).ping()
    except ImportError:
        return "the docker Python package is not installed"
    except Exception as error:  # the SDK raises many kinds; all mean: no engine
        reason = str(error).strip().splitlines()
        return f"no Docker API answers ({reason[-1] if reason else type(error).__name__})"
    return None


# The container user of RUNNER=docker: the host user's own IDs, so outputs belong to whoever ran make (as root,
# the images' non-root user; the run folder is then made writable for it).
CONTAINER_USER = "10001"


def run_container_then_remove(client, image: str, command: list[str], volumes: dict, **run_arguments) -> int:
    """kfp.local's `run_docker_container`, except that the exit code is read before the container is removed.

    kfp 2.17 starts each step's container with auto_remove=True and then asks for its exit code: when the container
    is already gone, Docker answers 404, which kfp takes for success (a failed step would pass), and podman's Docker
    API answers 500, which fails the run even when the step succeeded."""
    from kfp.local.docker_task_handler import add_latest_tag_if_not_present

    image = add_latest_tag_if_not_present(image=image)
    if not any(image in known.tags + known.attrs.get("RepoDigests", []) for known in client.images.list()):
        logger.info("pulling %s", image)
        client.images.pull(image)
    container = client.containers.run(
        image=image, command=command, detach=True, stdout=True, stderr=True, volumes=volumes, **run_arguments
    )
    try:
        for line in container.logs(stream=True, follow=True):
            print(line.decode(errors="replace"), end="")
        return container.wait()["StatusCode"]
    finally:
        container.remove(force=True)


def docker_runner(output_root: Path):
    """kfp.local's DockerRunner, running each step as KFP does on a cluster: a non-root user, a read-only root file
    system, a writable /tmp; the pipeline root (OUTPUT) is mounted at its own path."""
    from kfp import local
    from kfp.local import docker_task_handler

    docker_task_handler.run_docker_container = run_container_then_remove

    if os.getuid() == 0:
        user = CONTAINER_USER
        output_root.chmod(0o1777)  # like /tmp: everyone may create, only owners may remove
    else:
        user = f"{os.getuid()}:{os.getgid()}"
    return local.DockerRunner(user=user, read_only=True, tmpfs={"/tmp": "rw,exec,size=4g"}, network_mode="host")


def check_images_are_built() -> None:
    """Every image the pipeline names is on the engine (a missing one would be pulled from a registry that does not
    have this content's tag)."""
    import docker

    from components.images import IMAGE_OF_STAGE, image

    client = docker.from_env(timeout=60)
    for reference in sorted({image(stage) for stage in IMAGE_OF_STAGE}):
        try:
            client.images.get(reference)
        except docker.errors.ImageNotFound:
            raise CommandError(
                f"{reference}: not built (the image tag follows the code); run make images first"
            ) from None


def check_paths_are_mounted(parameters: dict[str, Any], output_root: Path) -> None:
    """RUNNER=docker mounts only OUTPUT: a local path elsewhere would not exist inside the containers."""
    for name in ("source", "promotion_root", "warm_start", "model_dir"):
        value = str(parameters.get(name) or "")
        if not value or "://" in value or value == "synthetic":
            continue
        path = Path(value).expanduser().resolve()
        if output_root != path and output_root not in path.parents:
            raise CommandError(
                f"{name}: {value} is outside {output_root}, the only folder RUNNER=docker mounts into the steps; "
                f"copy it under {output_root} or give a gs:// or s3:// URI"
            )


def local_run(pipeline, parameters: dict[str, Any], output_root: Path, runner: str = "subprocess") -> Path:
    """Run the whole pipeline on this machine through kfp.local; returns the run's folder (OUTPUT/<pipeline>-<time>;
    promoted models go to OUTPUT/models)."""
    from kfp import local

    check_parameters(pipeline, parameters)
    if parameters.get("launcher") in ("trainjob", "tfjob"):
        raise CommandError(
            f"launcher {parameters['launcher']} needs a Kubernetes cluster (make run); on this machine the workers are "
            "processes (launcher auto or pod)"
        )

    output_root = output_root.resolve()
    output_root.mkdir(parents=True, exist_ok=True)
    parameters = {"promotion_root": str(output_root / "models"), **parameters}
    if runner == "docker":
        problem = docker_engine_problem()
        if problem:
            raise CommandError(
                f"RUNNER=docker needs a running Docker engine, and here {problem}. With podman: podman system service "
                "and DOCKER_HOST=unix://<its socket>. Or run without containers: make local-run (the subprocess "
                "runner, same code and parameters)."
            )
        check_paths_are_mounted(parameters, output_root)
        check_images_are_built()
        local.init(runner=docker_runner(output_root), pipeline_root=str(output_root))
    elif runner == "subprocess":
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(output_root))
    else:
        raise CommandError(f"runner {runner!r} is not subprocess or docker")
    before = set(run_folders(pipeline, output_root))
    logger.info("running %s locally (%s runner) with %s", pipeline.name, runner, json.dumps(parameters, sort_keys=True))
    started = time.monotonic()
    pipeline(**parameters)
    (run_folder,) = set(run_folders(pipeline, output_root)) - before or {
        max(run_folders(pipeline, output_root), key=lambda p: p.stat().st_mtime)
    }
    logger.info("finished in %.0f s; outputs in %s", time.monotonic() - started, run_folder)
    for line in describe_run(run_folder, Path(parameters["promotion_root"])):
        logger.info("%s", line)
    return run_folder


def run_folders(pipeline, output_root: Path) -> list[Path]:
    """kfp.local's folders of this pipeline's runs: <pipeline name>-<timestamp>."""
    return [path for path in output_root.glob(f"{pipeline.name}-*") if path.is_dir()]


TRAINING_TASKS = "*train*-component*"  # train-component (in the pod), launch-training-job-component (a job)


def describe_run(run_folder: Path, promotion_root: Path) -> list[str]:
    """Where the run's main outputs are, for a person reading the terminal."""
    lines = []
    for label, pattern in (
        ("dataset manifest", "prepare-data-component/dataset/manifest.json"),
        ("model directory", f"{TRAINING_TASKS}/model"),
        ("evaluation report", "evaluate-component*/report"),
        ("evaluation metrics", f"{TRAINING_TASKS}/model/eval_metrics.json"),
    ):
        found = sorted(run_folder.glob(pattern))
        if found:
            lines.append(f"{label}: {found[0]}")
    metrics = sorted(run_folder.glob(f"{TRAINING_TASKS}/model/eval_metrics.json"))
    if metrics:
        summary = json.loads(metrics[0].read_text())
        lines.append(
            f"accuracy: {summary['metrics']['accuracy']:.4f}; " + ("BLESSED" if summary["blessed"] else "not blessed")
        )
    pointer = promotion_root / "current.json"
    if pointer.exists():
        current = json.loads(pointer.read_text())
        lines.append(f"promoted model: {current['version']} at {current['saved_model']}")
    models = sorted(run_folder.glob(f"{TRAINING_TASKS}/model"))
    if models:
        lines.append(f"TensorBoard: make tensorboard LOGDIR={models[0]}")
    return lines


# -- a KFP endpoint ---------------------------------------------------------------------------------------------


def client(host: str):
    import kfp

    if not host:
        raise CommandError("no KFP endpoint: set KFP_HOST (e.g. https://kubeflow.example.com/pipeline)")
    return kfp.Client(host=host)


def submit(pipeline, parameters: dict[str, Any], host: str, experiment: str, run_name: str | None) -> str:
    check_parameters(pipeline, parameters)
    package = compile_pipeline(pipeline)
    name = run_name or f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = client(host).create_run_from_pipeline_package(
        str(package),
        arguments=parameters,
        run_name=name,
        experiment_name=experiment,
        enable_caching=None,  # None keeps every task's own caching option; True or False would overwrite them all
    )
    logger.info("submitted run %s (%s) to %s", name, result.run_id, host)
    return result.run_id


def check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 6:
        raise CommandError(
            f"cron {expression!r} has {len(fields)} fields; KFP's cron has six, seconds first: "
            "'0 0 3 * * *' is every day at 03:00"
        )
    return expression


def schedule(
    pipeline, parameters: dict[str, Any], host: str, experiment: str, name: str, cron: str, max_concurrency: int = 1
) -> str:
    """A recurring run that retrains, warm-starting from the model promoted at the time of each run."""
    check_cron(cron)
    if not parameters.get("promotion_root"):
        raise CommandError("a schedule needs --promotion-root (a gs:// folder) to warm-start from and to promote to")
    parameters = {"warm_start_from_promoted": True, **parameters}
    check_parameters(pipeline, parameters)
    package = compile_pipeline(pipeline)
    kfp_client = client(host)
    experiment_id = kfp_client.create_experiment(experiment).experiment_id
    job = kfp_client.create_recurring_run(
        experiment_id=experiment_id,
        job_name=name,
        cron_expression=cron,
        max_concurrency=max_concurrency,
        no_catchup=True,
        params=parameters,
        pipeline_package_path=str(package),
        enable_caching=None,  # as in submit(): each task keeps its own caching option
    )
    logger.info("scheduled %s (%s): cron %r in experiment %s", name, job.recurring_run_id, cron, experiment)
    return job.recurring_run_id


# -- the command line -------------------------------------------------------------------------------------------


def build_parser(pipeline) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.pipeline", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="write pipeline/pipeline.yaml", allow_abbrev=False)
    compile_parser.add_argument("--output", type=Path, default=COMPILED)
    local = commands.add_parser("local-run", help="the whole pipeline on this machine (kfp.local)", allow_abbrev=False)
    local.add_argument("--runner", choices=("subprocess", "docker"), default="subprocess")
    local.add_argument("--output-root", type=Path, default=Path("outputs"))
    add_parameter_options(local, pipeline)
    run = commands.add_parser("run", help="compile and submit a run to the KFP endpoint", allow_abbrev=False)
    run.add_argument("--host", required=True)
    run.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    run.add_argument("--run-name")
    add_parameter_options(run, pipeline)
    recurring = commands.add_parser("schedule", help="create a recurring retraining run", allow_abbrev=False)
    recurring.add_argument("--host", required=True)
    recurring.add_argument("--cron", required=True, help="six fields, seconds first: '0 0 3 * * *'")
    recurring.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    recurring.add_argument("--name", default=f"{pipeline.name}-retraining")
    recurring.add_argument("--max-concurrency", type=int, default=1)
    add_parameter_options(recurring, pipeline)
    board = commands.add_parser(
        "tensorboard", help="TensorBoard on a model directory (local, gs:// or s3://)", allow_abbrev=False
    )
    board.add_argument("--logdir", required=True)
    board.add_argument("--port", type=int, default=6006)
    board.add_argument("--refresh-seconds", type=float, default=30.0, help="how often a remote logdir is mirrored")
    board.add_argument("--bind-all", action="store_true", help="listen on every interface, not only localhost")
    return parser


def main(pipeline, argv: list[str] | None = None) -> int:
    arguments = build_parser(pipeline).parse_args(argv)
    setup_logging()
    try:
        if arguments.command == "compile":
            compile_pipeline(pipeline, arguments.output)
        elif arguments.command == "local-run":
            local_run(pipeline, chosen_parameters(arguments, pipeline), arguments.output_root, arguments.runner)
        elif arguments.command == "run":
            submit(
                pipeline,
                chosen_parameters(arguments, pipeline),
                arguments.host,
                arguments.experiment,
                arguments.run_name,
            )
        elif arguments.command == "schedule":
            schedule(
                pipeline,
                chosen_parameters(arguments, pipeline),
                arguments.host,
                arguments.experiment,
                arguments.name,
                arguments.cron,
                arguments.max_concurrency,
            )
        elif arguments.command == "tensorboard":
            from components.common.tensorboard import serve

            return serve(arguments.logdir, arguments.port, arguments.refresh_seconds, arguments.bind_all)
    except (CommandError, ValueError) as error:
        logger.error("%s", error)
        return exit_codes.BAD_INPUT
    return exit_codes.SUCCESS
