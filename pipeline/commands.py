"""The pipeline's commands: compile, local-run (kfp.local), run (submit to KFP), schedule, tensorboard.

Every pipeline parameter is an option of local-run, run and schedule (`--train-steps 200`), generated from
the pipeline's own signature so the two never drift apart.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

from components.common import exit_codes
from components.common.logs import setup_logging

logger = logging.getLogger("pipeline")

# The compiled pipeline is package data (pyproject.toml), found beside this module however it was installed.
COMPILED = Path(str(resources.files("pipeline").joinpath("pipeline.yaml")))
# Each pipeline's compiled package (the training pipeline's is COMPILED); a pipeline not named here compiles to
# <its name>.yaml beside them.
COMPILED_FILES = {
    "cifar10-pipeline": COMPILED,
    "cifar10-predict": COMPILED.with_name("predict.yaml"),
    "cifar10-sweep": COMPILED.with_name("sweep.yaml"),
}


def compiled_path(pipeline) -> Path:
    return COMPILED_FILES.get(pipeline.name, COMPILED.with_name(f"{pipeline.name}.yaml"))


def trains(pipeline) -> bool:
    """Whether `pipeline` is the training pipeline (whose parameters the train stage's checks apply to)."""
    return "launcher" in _parameter_types(pipeline)


DEFAULT_EXPERIMENT = "cifar10"
LOCAL_RUN_SOURCE = "synthetic"  # local-run is a demo unless told otherwise (make local-run SOURCE=...)


class CommandError(RuntimeError):
    """A command cannot do what was asked (no Docker engine, a bad cron expression...)."""


# -- parameters -----------------------------------------------------------------------------------------------


def _parameter_types(pipeline) -> dict[str, tuple[str, Any]]:
    """{name: (KFP type, default)} of the pipeline's inputs."""
    return {name: (spec.type, spec.default) for name, spec in pipeline.component_spec.inputs.items()}


def _descriptions(pipeline) -> dict[str, str]:
    """{name: description} of the pipeline's inputs (from its docstring's Args, as the KFP UI shows them)."""
    return {name: spec.description or "" for name, spec in pipeline.component_spec.inputs.items()}


def parse_json(text: str) -> Any:
    """A JSON option's value, or a JSON or YAML file holding it (`--space space.yaml`); its error names the line and
    column, or the file."""
    if not text.lstrip().startswith(("{", "[")) and Path(text).is_file():
        import yaml

        from components.common import documents

        try:
            return yaml.safe_load(documents.read_bytes(text, "JSON or YAML file").decode("utf-8"))
        except (documents.DocumentError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise argparse.ArgumentTypeError(f"{text}: not JSON or YAML ({str(error).splitlines()[0]})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"not JSON: {error.msg} at line {error.lineno}, column {error.colno}: {text[:80]!r}"
        ) from None


def _converter(kfp_type: str):
    if kfp_type == "Boolean":
        from components.common.config import parse_bool

        return parse_bool
    if kfp_type == "Integer":
        return int
    if kfp_type == "Float":
        return float
    if kfp_type in ("Dict", "List"):
        return parse_json
    return str


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line (not the whole usage), and a misspelt option's nearest name."""

    def error(self, message: str):
        import difflib

        if message.startswith("unrecognized arguments:"):
            parsers = [self] + [
                parser for action in self._actions if action.choices and isinstance(action.choices, dict)
                for parser in action.choices.values()
            ]  # fmt: skip
            known = sorted(
                {option for parser in parsers for action in parser._actions for option in action.option_strings}
            )
            for given in message.split(":", 1)[1].split():
                if given.startswith("--"):
                    close = difflib.get_close_matches(given.split("=", 1)[0], known, n=1, cutoff=0.6)
                    if close:
                        message += f" (did you mean {close[0]}?)"
                        break
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def add_parameter_options(parser: argparse.ArgumentParser, pipeline, overrides: dict[str, Any] | None = None) -> None:
    """One option per pipeline parameter; `overrides` are this command's own defaults (shown as such)."""
    group = parser.add_argument_group("pipeline parameters (default: the pipeline's)")
    descriptions = _descriptions(pipeline)
    for name, (kfp_type, default) in _parameter_types(pipeline).items():
        default = (overrides or {}).get(name, default)
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


def check_parameters(pipeline, parameters: dict[str, Any]):
    """Refuse, in seconds and before any step runs, run parameters that the train step would refuse after the
    data was prepared: an unknown launcher, both epochs and train_steps, an option the train stage does not know
    or a value it refuses, a train option that repeats a named parameter, a bad worker setting. (Only the training
    pipeline's: another pipeline's parameters are checked by its step.)"""
    from components.common.kfp_parameters import config_from_parameters
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig

    if not trains(pipeline):
        return None
    for name in ("epochs", "train_steps"):
        if name in parameters and not parameters[name] > 0:
            raise CommandError(
                f"{name}: {parameters[name]} is not a length; give a positive number, or leave it out for the "
                "recipe's own length"
            )
    defaults = {name: default for name, (_kind, default) in _parameter_types(pipeline).items()}
    values = {**defaults, **parameters}
    if values["launcher"] not in LAUNCHERS:
        raise CommandError(f"launcher: {values['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
    check_data_parameters(values)
    check_registry_parameters(values)
    check_sweep_parameters(values)
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
        config = config_from_parameters(TrainConfig, train, "pipeline parameters")
        config_from_parameters(LaunchConfig, launch, "pipeline parameters")
    except ValueError as error:
        raise CommandError(str(error)) from error
    return config


def check_data_parameters(values: dict[str, Any]) -> None:
    """The data check's and the leakage's parameters, as their steps would refuse them after the data was prepared."""
    from components.evaluate.data_check import CheckDataConfig
    from components.prepare_data.config import PrepareDataConfig

    try:
        PrepareDataConfig(output="/check", leakage=values["leakage"])
    except ValueError as error:
        raise CommandError(str(error)) from error
    try:
        CheckDataConfig(data="/check", mode=values["data_check"], thresholds=dict(values["data_thresholds"] or {}))
    except ValueError as error:
        message = str(error)  # the step's field names, as the pipeline's parameters call them
        for field_name, parameter in (("mode:", "data_check:"), ("thresholds:", "data_thresholds:")):
            message = parameter + message.removeprefix(field_name) if message.startswith(field_name) else message
        raise CommandError(message) from error


def check_sweep_parameters(values: dict[str, Any]) -> None:
    """The sweep pipeline's search space and budget, as its sweep step would refuse them after the data was
    prepared (nothing for a pipeline without a search)."""
    if "space" not in values:
        return
    from components.sweep.config import SweepConfig
    from components.sweep.space import parse_space

    names = ("trials", "max_minutes", "sampler", "pruner", "startup_trials", "parallelism", "repeats")
    try:
        parse_space(values["space"], "space")
        SweepConfig(data="/check", sweep_dir="/check", space="{}", workers=values["trial_workers"],
                    **{name: values[name] for name in names})  # fmt: skip
    except ValueError as error:
        raise CommandError(str(error)) from error


def check_registry_parameters(values: dict[str, Any]) -> None:
    """The Model Registry's address and model name, as the promote step would refuse them after training."""
    from components.evaluate.registry import check_address, check_model_name

    try:
        if values.get("model_registry"):
            check_address(values["model_registry"])
        check_model_name(values.get("registered_model_name", "cifar10"))
    except ValueError as error:
        raise CommandError(str(error)) from error


def describe_length(config) -> str:
    """How long training is, as a person reads it before a long run."""
    recipe = f"the {config.preset} recipe" if config.preset else "no preset"
    if config.train_steps is not None:
        return f"{config.train_steps} steps of batch {config.batch_size} ({recipe})"
    if config.epochs is not None:
        return f"{config.epochs:g} epochs of batch {config.batch_size} ({recipe})"
    return (
        f"80000 steps of batch {config.batch_size}, the stage's default ({recipe}; --epochs or --train-steps to set it)"
    )


# -- compile ----------------------------------------------------------------------------------------------------


def compile_pipeline(pipeline, output: Path | None = None) -> Path:
    from kfp import compiler

    output = output or compiled_path(pipeline)
    compiler.Compiler().compile(pipeline, str(output))
    output.write_text(with_sorted_default_comments(output.read_text()))
    logger.info("compiled %s", output)
    return output


_DEFAULT_COMMENT = re.compile(r"^(#    \w+: \w+ \[Default: )(\{.*\})(\])$")


def with_sorted_default_comments(text: str) -> str:
    """The compiled YAML with each dict default in its header comment written with sorted keys: kfp writes them in
    the order of a protobuf map, which changes from process to process, so that the same pipeline compiled twice
    differed in a comment (and the check that the committed YAML is current failed at random)."""

    def in_order(value):
        if isinstance(value, dict):
            return {key: in_order(value[key]) for key in sorted(value)}
        return [in_order(item) for item in value] if isinstance(value, list) else value

    def rewritten(line: str) -> str:
        match = _DEFAULT_COMMENT.match(line)
        if not match:
            return line
        try:
            value = ast.literal_eval(match.group(2))
        except (ValueError, SyntaxError):
            return line
        return f"{match.group(1)}{in_order(value)!r}{match.group(3)}"

    return "\n".join(rewritten(line) for line in text.split("\n"))


COMPONENTS_ROOT = Path(str(resources.files("components")))


def compile_components(root: Path = COMPONENTS_ROOT) -> list[Path]:
    """Each stage's published component YAML (pipeline.PUBLISHED_COMPONENTS), under `root`/<stage>/."""
    from kfp import compiler

    from pipeline.pipeline import PUBLISHED_COMPONENTS

    written = []
    for relative, component in PUBLISHED_COMPONENTS.items():
        output = root / relative
        output.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(component, str(output))
        written.append(output)
    logger.info("compiled %d component files under %s", len(written), root)
    return written


# -- local-run --------------------------------------------------------------------------------------------------


# -- a KFP endpoint (pipeline/kfp_endpoint.py owns the client, the credentials and the namespace) ----------------


def submit(
    pipeline,
    parameters: dict[str, Any],
    endpoint_config,
    experiment: str,
    run_name: str | None,
    wait: bool = False,
    wait_timeout_seconds: float = 7 * 24 * 3600,
    poll_seconds: float = 10.0,
) -> str:
    from pipeline import kfp_endpoint

    check_parameters(pipeline, parameters)
    endpoint = kfp_endpoint.connect(endpoint_config)
    package = compile_pipeline(pipeline)
    name = run_name or f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = endpoint.call(
        f"submitting run {name}",
        lambda: endpoint.client.create_run_from_pipeline_package(
            str(package),
            arguments=parameters,
            run_name=name,
            experiment_name=experiment,
            namespace=endpoint.namespace,
            enable_caching=None,  # None keeps every task's own caching option; True or False would overwrite them all
        ),
        identifier="run_id",
    )
    logger.info("submitted run %s (%s): %s", name, result.run_id, kfp_endpoint.run_address(endpoint, result.run_id))
    if wait:
        kfp_endpoint.follow_run(endpoint, result.run_id, wait_timeout_seconds, poll_seconds)
    return result.run_id


def check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 6:
        raise CommandError(
            f"cron {expression!r} has {len(fields)} fields; KFP's cron has six, seconds first: "
            "'0 0 3 * * *' is every day at 03:00"
        )
    return expression


# A schedule's own defaults: it warm-starts from the promoted model, and promotes nothing trained on data the data check
# finds changed (a one-off run only warns).
SCHEDULE_DEFAULTS = {"warm_start_from_promoted": True, "data_check": "block"}


def schedule(
    pipeline,
    parameters: dict[str, Any],
    endpoint_config,
    experiment: str,
    name: str,
    cron: str,
    max_concurrency: int = 1,
) -> str:
    """A recurring run that retrains, warm-starting from the model promoted at the time of each run."""
    from pipeline import kfp_endpoint

    check_cron(cron)
    if trains(pipeline) and not parameters.get("promotion_root"):
        raise CommandError("a schedule needs --promotion-root (a gs:// folder) to warm-start from and to promote to")
    own = _parameter_types(pipeline)
    parameters = {**{name: value for name, value in SCHEDULE_DEFAULTS.items() if name in own}, **parameters}
    check_parameters(pipeline, parameters)
    endpoint = kfp_endpoint.connect(endpoint_config)
    package = compile_pipeline(pipeline)
    experiment_id = endpoint.call(
        f"creating experiment {experiment}",
        lambda: endpoint.client.create_experiment(experiment, namespace=endpoint.namespace),
        identifier="experiment_id",
    ).experiment_id
    job = endpoint.call(
        f"scheduling {name}",
        lambda: endpoint.client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=name,
            cron_expression=cron,
            max_concurrency=max_concurrency,
            no_catchup=True,
            params=parameters,
            pipeline_package_path=str(package),
            enable_caching=None,  # as in submit(): each task keeps its own caching option
        ),
        identifier="recurring_run_id",
    )
    logger.info("scheduled %s (%s): cron %r in experiment %s", name, job.recurring_run_id, cron, experiment)
    return job.recurring_run_id


# -- the command line -------------------------------------------------------------------------------------------


def add_endpoint_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="the KFP endpoint (Kubeflow: https://<kubeflow>/pipeline)")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    parser.add_argument(
        "--namespace",
        help="the profile namespace of a multi-user Kubeflow (default: $KFP_NAMESPACE, then kfp's context, then the "
        "pod's namespace)",
    )
    parser.add_argument("--ca-bundle", help="CA certificates of a private TLS endpoint (default: $KFP_CA_BUNDLE)")


def endpoint_config(arguments: argparse.Namespace):
    from pipeline.kfp_endpoint import EndpointConfig

    return EndpointConfig(host=arguments.host, namespace=arguments.namespace, ca_bundle=arguments.ca_bundle)


def build_parser(pipeline) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m pipeline.pipeline", description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="write pipeline/pipeline.yaml", allow_abbrev=False)
    compile_parser.add_argument(
        "--output", type=Path, default=None, help="(default: the pipeline's own, under pipeline/)"
    )
    compile_parser.add_argument(
        "--components-root",
        type=Path,
        default=COMPONENTS_ROOT,
        help="where each stage's component YAML goes (<root>/<stage>/component.yaml) (default: components/)",
    )
    local = commands.add_parser("local-run", help="the whole pipeline on this machine (kfp.local)", allow_abbrev=False)
    local.add_argument(
        "--runner",
        choices=("subprocess", "docker"),
        default="subprocess",
        help="subprocess: each step a process of this Python environment; docker: each step in its image, as on a "
        "cluster (make images first) (default: subprocess)",
    )
    local.add_argument(
        "--output-root",
        type=Path,
        default=Path("outputs"),
        help="where each run's folder (<pipeline>-<time>/, with its local-run.log) and the promoted models (models/) "
        "go (default: outputs)",
    )
    local.add_argument("--verbose", action="store_true", help="show every line of every step, not only the progress")
    local.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the training of an earlier run (its folder, its name, or last) from its latest checkpoint",
    )
    add_parameter_options(local, pipeline, overrides={"source": LOCAL_RUN_SOURCE})
    cleaner = commands.add_parser(
        "clean-runs", help="remove the run folders of local runs; promoted models stay", allow_abbrev=False
    )
    cleaner.add_argument("--output-root", type=Path, default=Path("outputs"), help="(default: outputs)")
    cleaner.add_argument("--keep", type=int, default=0, help="keep the newest KEEP runs (default: 0)")
    cleaner.add_argument(
        "--all", action="store_true", help="remove interrupted runs too (kept by default: they can be resumed)"
    )
    run = commands.add_parser("run", help="compile and submit a run to the KFP endpoint", allow_abbrev=False)
    add_endpoint_options(run)
    run.add_argument("--run-name")
    run.add_argument(
        "--wait", action="store_true", help="follow the run to its end; the exit code says how it ended (0: succeeded)"
    )
    run.add_argument(
        "--wait-timeout", type=float, default=7 * 24 * 3600.0, metavar="SECONDS", help="(default: 604800, 7 days)"
    )
    run.add_argument("--poll-seconds", type=float, default=10.0, help="how often --wait reads the run (default: 10)")
    add_parameter_options(run, pipeline)
    recurring = commands.add_parser("schedule", help="create a recurring retraining run", allow_abbrev=False)
    add_endpoint_options(recurring)
    recurring.add_argument("--cron", required=True, help="six fields, seconds first: '0 0 3 * * *'")
    recurring.add_argument("--name", default=f"{pipeline.name}-{'retraining' if trains(pipeline) else 'scheduled'}")
    recurring.add_argument("--max-concurrency", type=int, default=1)
    add_parameter_options(recurring, pipeline, {key: value for key, value in SCHEDULE_DEFAULTS.items()
                                                if key in _parameter_types(pipeline)})  # fmt: skip
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
            if arguments.components_root is not None:
                compile_components(arguments.components_root)
        elif arguments.command == "local-run":
            from pipeline.local_run import local_run

            parameters = chosen_parameters(arguments, pipeline)  # the source's default is local-run's own
            local_run(
                pipeline, parameters, arguments.output_root, arguments.runner, arguments.verbose, arguments.resume
            )
        elif arguments.command == "clean-runs":
            from pipeline.local_run import clean_runs

            clean_runs(pipeline.name, arguments.output_root, arguments.keep, arguments.all)
        elif arguments.command == "run":
            submit(
                pipeline,
                chosen_parameters(arguments, pipeline),
                endpoint_config(arguments),
                arguments.experiment,
                arguments.run_name,
                arguments.wait,
                arguments.wait_timeout,
                arguments.poll_seconds,
            )
        elif arguments.command == "schedule":
            schedule(
                pipeline,
                chosen_parameters(arguments, pipeline),
                endpoint_config(arguments),
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
    except RuntimeError as error:
        from pipeline.kfp_endpoint import EndpointError, RunOutcomeError

        if isinstance(error, EndpointError):
            logger.error("%s", error)
            return exit_codes.BAD_INPUT
        if isinstance(error, RunOutcomeError):
            logger.error("%s", error)
            return error.exit_code
        from pipeline.local_run import RunFailedError, RunInterruptedError

        if isinstance(error, RunInterruptedError):
            logger.warning("%s", error)
            return error.exit_code
        if isinstance(error, RunFailedError):
            logger.error("%s", error)
            return error.exit_code
        raise
    return exit_codes.SUCCESS
