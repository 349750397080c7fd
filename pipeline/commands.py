"""The pipeline's commands: compile, local-run (kfp.local), run (submit to KFP), schedule, tensorboard.

Every pipeline parameter is an option of local-run, run and schedule (`--train-steps 200`), generated from
the pipeline's own signature so the two never drift apart.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import re
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from components.common import exit_codes, storage
from components.common.config import ArgumentParser
from components.common.logs import setup_logging
from pipeline.cron import cron_problem
from pipeline.parameters import (
    DEFAULT_OUTPUT_ROOT,
    LOCAL_RUN_SOURCE,
    CommandError,
    check_parameters,
    parameter_types,
    trains,
)

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


def fan_out_path(pipeline) -> Path:
    """Where `compile --prepare-fan-out` writes the pipeline fanned out (not kept in the repository)."""
    path = compiled_path(pipeline)
    return path.with_name(f"{path.stem}-fan-out.yaml")


DEFAULT_EXPERIMENT = "cifar10"


# -- parameters -----------------------------------------------------------------------------------------------


def _descriptions(pipeline) -> dict[str, str]:
    """{name: description} of the pipeline's inputs (from its docstring's Args, as the KFP UI shows them)."""
    return {name: spec.description or "" for name, spec in pipeline.component_spec.inputs.items()}


def parse_json(text: str) -> Any:
    """A JSON option's value: inline JSON (starting with { or [), or a JSON or YAML file holding it (`--space
    space.yaml`), read by the one reader of documents (components/common/documents.py: size, depth and number
    bounds); its error names the line and column, or the file."""
    from components.common import documents

    try:
        if text.lstrip().startswith(("{", "[")):
            return documents.load(text, f"inline JSON {_shortened(text)}", "value", yaml_allowed=False)
        content = storage.document_bytes(str(Path(text).expanduser()), "JSON or YAML file")
        value = documents.load(content, text, "JSON or YAML document")
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(
            f"{text}: no such file (give a JSON or YAML file, or inline JSON starting with {{ or [)"
        ) from None
    except OSError as error:  # a name too long to be a file's, a folder, one it may not read
        raise argparse.ArgumentTypeError(
            f"{_shortened(text)}: not a file that can be read ({error.strerror}); give a JSON or YAML file, or inline "
            "JSON starting with { or ["
        ) from None
    except documents.DocumentError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value is None:  # taken for the option not given, a default would run in its place
        raise argparse.ArgumentTypeError(
            f"{text}: holds no value (it is empty, only comments, or null); give a JSON object, or leave the option "
            "out for its default"
        )
    return value


def _shortened(text: str, limit: int = 40) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def number_in(kind: type, low: float, high: float, what: str):
    """An argparse type: a `kind` (int or float) number in [low, high], finite; else "'TEXT' is not WHAT"."""
    import math

    def converted(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return converted


SECONDS = number_in(float, 1e-3, 1e9, "a number of seconds (more than 0)")


def _converter(kfp_type: str):
    if kfp_type == "Boolean":
        from components.common.values import parse_bool

        return parse_bool
    if kfp_type == "Integer":
        return int
    if kfp_type == "Float":
        return float
    if kfp_type in ("Dict", "List"):
        return parse_json
    return str


class OneLineParser(ArgumentParser):
    """argparse (an option given twice refused), with a mistake said in one line (not the whole usage), and a
    misspelt option's nearest name."""

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
    for name, (kfp_type, default) in parameter_types(pipeline).items():
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
        for name in parameter_types(pipeline)
        if getattr(arguments, f"parameter_{name}") is not None
    }


# -- compile ----------------------------------------------------------------------------------------------------


def compile_pipeline(pipeline, output: Path | None = None, quiet: bool = False) -> Path:
    from kfp import compiler

    output = output or compiled_path(pipeline)
    compiler.Compiler().compile(pipeline, str(output))
    compiled = output.read_text()  # reader: the pipeline file kfp's compiler just wrote
    output.write_text(with_sorted_default_comments(compiled))  # writer: the same file, its defaults commented
    if not quiet:
        from components.images import images_named_in

        named = images_named_in(output.read_text())  # reader: the pipeline file just compiled
        logger.info(
            "compiled %s%s", output, f" (images: {named[0]}/cpu:{named[1]} and gpu:{named[1]})" if named else ""
        )
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

    from pipeline.training_pipeline import PUBLISHED_COMPONENTS

    written = []
    for relative, component in PUBLISHED_COMPONENTS.items():
        output = root / relative
        output.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(component, str(output))
        written.append(output)
    logger.info("compiled %d component files under %s", len(written), root)
    return written


# -- what a submission sends ----------------------------------------------------------------------------------


def check_backend(package: Path, version: str, host: str) -> None:
    """Refuse, in one line, a compiled pipeline that the KFP backend `version` cannot run; say in a line each what it
    would run without (pipeline/backend_support.py reads both from the backend's sources)."""
    import yaml

    from pipeline import backend_support

    documents = list(yaml.safe_load_all(package.read_text()))  # reader: the pipeline file just compiled
    used = backend_support.constructs_used(documents)
    oldest = backend_support.oldest_release(documents)
    if backend_support.version_key(version) is None:
        logger.warning(
            "the KFP backend at %s does not name its version (%r): this pipeline needs %s or newer", host, version,
            oldest or "a release none of docs/cluster.md's is"
        )  # fmt: skip
        return
    failing, ignored = backend_support.problems(used, version)
    release = backend_support.RELEASES.get(version)
    named = f"KFP {version}" + (f" ({release})" if release else "")
    if failing:
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        raise CommandError(
            f"the KFP backend at {host} is {named}, which cannot run this pipeline: {failing[0]}{more}; it needs KFP "
            f"{oldest or '(no release)'} or newer (docs/cluster.md)"
        )
    for sentence in ignored:
        logger.warning("KFP %s runs this pipeline without %s", version, sentence)


def package_for_submission(pipeline, directory: Path) -> Path:
    """The pipeline compiled for a submission, into `directory` (the compiled file under pipeline/ is `make
    compile`'s and stays as it wrote it), naming the images `make compile REGISTRY=... TAG=...` wrote into that file
    (its registry, and a tag it was given rather than derived from the code) unless REGISTRY or TAG is given now;
    says in one line which images it names."""
    from components import images

    package = compile_pipeline(pipeline, directory / compiled_path(pipeline).name, quiet=True)
    text = package.read_text()  # reader: the pipeline file just compiled
    named = images.images_named_in(text)
    if named is None:  # a pipeline without the project's images
        return package
    registry, tag = named
    compiled = compiled_path(pipeline)
    # reader: the pipeline file make compile wrote
    remembered = images.images_named_in(compiled.read_text()) if compiled.is_file() else None
    given = {name: bool(os.environ.get(f"CIFAR10_PIPELINE_{name}")) for name in ("REGISTRY", "TAG")}
    kept = []
    if remembered and not given["REGISTRY"] and remembered[0] != registry:
        kept.append("REGISTRY")
    if remembered and not given["TAG"] and remembered[1] != tag and not images.is_content_tag(remembered[1]):
        kept.append("TAG")  # a tag make compile was given (a content tag there is older code's: said below)
    if kept:
        chosen = remembered[0] if "REGISTRY" in kept else registry, remembered[1] if "TAG" in kept else tag
        for kind in images.KINDS:
            text = text.replace(f"{registry}/{kind}:{tag}", f"{chosen[0]}/{kind}:{chosen[1]}")
        package.write_text(text)  # writer: the pipeline file this command compiled
        registry, tag = chosen
    where = " and ".join(name for name, value in given.items() if value)
    if kept:
        where = ", ".join(filter(None, [where, f"{' and '.join(kept)} as make compile wrote {compiled.name}"]))
    logger.info("images: %s/cpu:%s and gpu:%s%s", registry, tag, tag, f" ({where})" if where else "")
    if registry == images.DEFAULT_REGISTRY:
        logger.warning(
            "no images are published at %s: build and push yours, then name them: make push REGISTRY=<yours> && "
            "make compile REGISTRY=<yours>", registry
        )  # fmt: skip
    elif remembered and remembered[1] != tag:
        logger.warning(
            "%s was compiled from other code (tag %s); this submission names tag %s: push its images (make push "
            "REGISTRY=%s)", compiled.name, remembered[1], tag, registry
        )  # fmt: skip
    return package


def say_the_source(pipeline, parameters: dict[str, Any]) -> None:
    """On a cluster, the data a run trains on is said in one line when it is the pipeline's default."""
    if "source" in parameter_types(pipeline) and "source" not in parameters:
        logger.info(
            "source: %s (the pipeline's default; SOURCE=... for your data)", parameter_types(pipeline)["source"][1]
        )


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
    name = run_name or f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    say_the_source(pipeline, parameters)
    with tempfile.TemporaryDirectory(prefix="cifar10-pipeline-") as directory:
        package = package_for_submission(pipeline, Path(directory))
        check_backend(package, endpoint.backend_version, endpoint.config.host)
        result = endpoint.call(
            f"submitting run {name}",
            lambda: endpoint.client.create_run_from_pipeline_package(
                str(package),
                arguments=parameters,
                run_name=name,
                experiment_name=experiment,
                namespace=endpoint.namespace,
                enable_caching=None,  # None keeps every task's own caching option; True or False would overwrite all
            ),
            identifier="run_id",
        )
    logger.info("submitted run %s (%s): %s", name, result.run_id, kfp_endpoint.run_address(endpoint, result.run_id))
    if wait:
        kfp_endpoint.follow_run(endpoint, result.run_id, wait_timeout_seconds, poll_seconds)
    return result.run_id


def check_cron(expression: str) -> str:
    problem = cron_problem(expression)
    if problem:
        raise CommandError(f"cron {expression!r}: {problem}")
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
    replace: bool = False,
) -> str:
    """A recurring run that retrains, warm-starting from the model promoted at the time of each run. A schedule of
    the same name is refused, or with `replace` replaced (the new one is made, then the old one deleted)."""
    from pipeline import kfp_endpoint

    check_cron(cron)
    if trains(pipeline) and not parameters.get("promotion_root"):
        raise CommandError(
            "a schedule needs --promotion-root (PROMOTION_ROOT=, a gs:// or s3:// prefix) to warm-start from and to "
            "promote to"
        )
    own = parameter_types(pipeline)
    parameters = {**{name: value for name, value in SCHEDULE_DEFAULTS.items() if name in own}, **parameters}
    check_parameters(pipeline, parameters)
    endpoint = kfp_endpoint.connect(endpoint_config)
    existing = kfp_endpoint.recurring_runs(endpoint, name)
    if existing and not replace:
        raise CommandError(
            f"a schedule named {name} exists ({existing[0].recurring_run_id}, {existing[0].status}): REPLACE=1 "
            "(--replace) replaces it, NAME=... (--name) makes another; make schedules lists them"
        )
    say_the_source(pipeline, parameters)
    with tempfile.TemporaryDirectory(prefix="cifar10-pipeline-") as directory:
        package = package_for_submission(pipeline, Path(directory))
        check_backend(package, endpoint.backend_version, endpoint.config.host)  # before anything is created
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
    for old in existing:
        kfp_endpoint.change_recurring_run(endpoint, old.recurring_run_id, "delete")
        logger.info("replaced %s: deleted the earlier schedule %s", name, old.recurring_run_id)
    return job.recurring_run_id


def list_schedules(endpoint_config, change: tuple[str, str] | None = None) -> list:
    """The recurring runs the endpoint holds (in the namespace), one line each; `change` = (enable|disable|delete,
    name) changes the one of that name first."""
    from pipeline import kfp_endpoint

    endpoint = kfp_endpoint.connect(endpoint_config)
    if change is not None:
        action, name = change
        found = kfp_endpoint.recurring_runs(endpoint, name)
        if not found:
            raise CommandError(f"no schedule is named {name}; make schedules lists them")
        for recurring in found:
            kfp_endpoint.change_recurring_run(endpoint, recurring.recurring_run_id, action)
            logger.info("%s: %s (%s)", name, {"enable": "enabled", "disable": "disabled", "delete": "deleted"}[action],
                        recurring.recurring_run_id)  # fmt: skip
    listed = kfp_endpoint.recurring_runs(endpoint)
    for recurring in listed:
        trigger = recurring.trigger
        cron = trigger.cron_schedule.cron if trigger and trigger.cron_schedule else "(periodic)"
        logger.info("%s  %s  %s  cron %r  created %s", recurring.display_name, recurring.recurring_run_id,
                    recurring.status or recurring.mode, cron, recurring.created_at)  # fmt: skip
    if not listed:
        logger.info("no schedules%s", f" in namespace {endpoint.namespace}" if endpoint.namespace else "")
    return listed


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


def add_fan_out_option(parser: argparse.ArgumentParser, pipeline) -> None:
    if "prepare_workers" in parameter_types(pipeline):
        parser.add_argument(
            "--prepare-fan-out",
            action="store_true",
            help="prepare in a ParallelFor of prepare_workers pods merged by the prepare step (KFP backend 2.14 or "
            "newer; without it, prepare_workers are processes of the one prepare step's pod)",
        )


def fanned_out(pipeline, arguments: argparse.Namespace):
    """The pipeline the command runs: `pipeline`, or with --prepare-fan-out its fanned-out variant."""
    if not getattr(arguments, "prepare_fan_out", False):
        return pipeline
    from pipeline.training_pipeline import with_prepare_fan_out

    return with_prepare_fan_out(pipeline)


def build_parser(pipeline) -> argparse.ArgumentParser:
    word = {"cifar10-sweep": " sweep", "cifar10-predict": " predict"}.get(pipeline.name, "")
    parser = OneLineParser(
        prog=f"python -m pipeline.pipeline{word}", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser(
        "compile", help=f"write pipeline/{compiled_path(pipeline).name}", allow_abbrev=False
    )
    compile_parser.add_argument(
        "--output", type=Path, default=None, help="(default: the pipeline's own, under pipeline/)"
    )
    compile_parser.add_argument(
        "--components-root",
        type=Path,
        default=COMPONENTS_ROOT,
        help="where each stage's component YAML goes (<root>/<stage>/component.yaml) (default: components/)",
    )
    add_fan_out_option(compile_parser, pipeline)
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
        default=DEFAULT_OUTPUT_ROOT,
        help="where each run's folder (<pipeline>-<time>/, with its local-run.log) and the promoted models (models/) "
        "go (default: outputs)",
    )
    local.add_argument("--verbose", action="store_true", help="show every line of every step, not only the progress")
    add_fan_out_option(local, pipeline)
    local.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the training of an earlier run (its folder, its name, or last) from its latest checkpoint",
    )
    add_parameter_options(local, pipeline, overrides={"source": LOCAL_RUN_SOURCE})
    cleaner = commands.add_parser(
        "clean-runs", help="remove the run folders of local runs; promoted models stay", allow_abbrev=False
    )
    cleaner.add_argument("--output-root", type=Path, default=DEFAULT_OUTPUT_ROOT, help="(default: outputs)")
    cleaner.add_argument(
        "--keep",
        type=number_in(int, 0, 1e9, "a number of runs (0 or more)"),
        default=0,
        help="keep the newest KEEP runs (default: 0)",
    )
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
        "--wait-timeout", type=SECONDS, default=7 * 24 * 3600.0, metavar="SECONDS", help="(default: 604800, 7 days)"
    )
    run.add_argument("--poll-seconds", type=SECONDS, default=10.0, help="how often --wait reads the run (default: 10)")
    add_fan_out_option(run, pipeline)
    add_parameter_options(run, pipeline)
    recurring = commands.add_parser(
        "schedule", help=f"create a recurring run{' (retraining)' if trains(pipeline) else ''}", allow_abbrev=False
    )
    add_endpoint_options(recurring)
    recurring.add_argument("--cron", required=True, help="six fields, seconds first: '0 0 3 * * *'")
    recurring.add_argument("--name", default=f"{pipeline.name}-{'retraining' if trains(pipeline) else 'scheduled'}")
    recurring.add_argument(  # the KFP API takes 1 to 10
        "--max-concurrency", type=number_in(int, 1, 10, "a number of runs from 1 to 10"), default=1
    )
    recurring.add_argument(
        "--replace", action="store_true", help="replace a schedule of the same name (without it, one is refused)"
    )
    add_fan_out_option(recurring, pipeline)
    add_parameter_options(recurring, pipeline, {key: value for key, value in SCHEDULE_DEFAULTS.items()
                                                if key in parameter_types(pipeline)})  # fmt: skip
    listing = commands.add_parser(
        "schedules", help="list the recurring runs; enable, disable or delete one by its name", allow_abbrev=False
    )
    add_endpoint_options(listing)
    changes = listing.add_mutually_exclusive_group()
    for action in ("enable", "disable", "delete"):
        changes.add_argument(f"--{action}", metavar="NAME", help=f"{action} the schedule of this name, then list")
    board = commands.add_parser(
        "tensorboard", help="TensorBoard on a model directory (local, gs:// or s3://)", allow_abbrev=False
    )
    board.add_argument("--logdir", required=True)
    board.add_argument("--port", type=number_in(int, 1, 65535, "a port (1 to 65535)"), default=6006)
    board.add_argument("--refresh-seconds", type=SECONDS, default=30.0, help="how often a remote logdir is mirrored")
    board.add_argument("--bind-all", action="store_true", help="listen on every interface, not only localhost")
    return parser


# How long the KFP API server lets each name be (its database's columns: an experiment's name varchar(128), a run's and
# a recurring run's display name varchar(255)); a longer one is refused after the pipeline was uploaded.
NAME_LENGTHS = {"experiment": 128, "run_name": 255, "name": 255}


def check_names(**names: str | None) -> None:
    """A run's, schedule's or experiment's name: not empty, no control character, within the API's bound."""
    from components.common.config import shown
    from components.common.filesystem import CONTROL_CHARACTER

    for field, value in names.items():
        if value is None:
            continue
        if not value.strip():
            raise CommandError(f"{field}: an empty name; give one, or leave it out for the default")
        if CONTROL_CHARACTER.search(value):
            raise CommandError(f"{field}: {shown(value)} holds a control character (a newline, a tab)")
        if len(value) > NAME_LENGTHS[field]:
            raise CommandError(f"{field}: {len(value)} characters, more than the KFP API keeps ({NAME_LENGTHS[field]})")


def main(pipeline, argv: list[str] | None = None) -> int:
    arguments = build_parser(pipeline).parse_args(argv)
    setup_logging()
    default, pipeline = pipeline, fanned_out(pipeline, arguments)
    try:
        if arguments.command == "compile":
            fan_out = pipeline is not default  # beside the pipeline's own file, <name>-fan-out.yaml
            output = arguments.output or (fan_out_path(pipeline) if fan_out else None)
            compile_pipeline(pipeline, output)
            if not fan_out and compiled_path(pipeline) == COMPILED:  # the stages' components, with the training one
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
            check_names(experiment=arguments.experiment, run_name=arguments.run_name)
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
            check_names(experiment=arguments.experiment, name=arguments.name)
            schedule(
                pipeline,
                chosen_parameters(arguments, pipeline),
                endpoint_config(arguments),
                arguments.experiment,
                arguments.name,
                arguments.cron,
                arguments.max_concurrency,
                arguments.replace,
            )
        elif arguments.command == "schedules":
            chosen = [(action, getattr(arguments, action)) for action in ("enable", "disable", "delete")]
            list_schedules(endpoint_config(arguments), next(((a, n) for a, n in chosen if n), None))
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
