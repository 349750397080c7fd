"""The make targets and their variables, in one table: which variables each target takes and the option each becomes.

The Makefile reads this table and nothing else about variables: before any target runs it asks `check` whether every
variable given on make's command line is one that a chosen target takes (a misspelt one, or one the target would
ignore, is one line naming it and the targets that take it, exit 2), and the targets that run the project's
programs are all one recipe, `python -m pipeline.make TARGET`, which builds the command from this table.

Without make, the same command takes the same variables and keeps the program's exit code (make turns every failure
into its own 2), which is what CI wants from `run WAIT=1`:

    .venv/bin/python -m pipeline.make run KFP_HOST=https://... WAIT=1 SOURCE=s3://...      (0, 1, 124, 130)

`check` and `help` run with any Python 3 and import nothing of the project (they run before `make install`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable

# Settings the programs read from the environment: given on make's command line, make hands them on.
ENVIRONMENT_SETTINGS = ("KFP_*", "KF_*", "AWS_*", "GOOGLE_*", "CIFAR10_PIPELINE_*", "CONTAINERS_*", "BUILDAH_*",
                        "DOCKER_*", "STORAGE_EMULATOR_HOST", "HOME", "TMPDIR", "XDG_*")  # fmt: skip
EVERY_TARGET = ("VENV",)  # the environment the programs run in (make install makes it)
SPACE_DEFAULT = "pipeline/sweep_space.yaml"  # relative to the repository


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    help: str
    default: str = ""


VARIABLES = {
    variable.name: variable
    for variable in (
        Variable("VENV", "the environment make install creates and every program runs in", ".venv"),
        Variable("PYTHON", "the Python that creates the environment", "python3"),
        Variable("OUTPUT", "where runs, promoted models (OUTPUT/models), datasets and predictions go", "outputs"),
        Variable("SOURCE", "the data: an archive, a folder of class folders, a URL, a gs:// or s3:// URI, or "
                 "synthetic (local runs: synthetic; on a cluster: the pipeline's default, the official archive)"),
        Variable("RUNNER", "subprocess (each step a process) or docker (each step in its image: make images first)",
                 "subprocess"),
        Variable("WORKERS", "training workers (local processes, or the pods of a training job)", "2"),
        Variable("DEPTH", "ResNet depth, 6n+2 (the demo: 8)"),
        Variable("BATCH_SIZE", "global batch size", "128"),
        Variable("TRAIN_STEPS", "training length in steps (the demo: 300)"),
        Variable("EPOCHS", "training length in epochs"),
        Variable("THRESHOLD", "the gate: the lowest test accuracy that may be promoted", "0.5"),
        Variable("TRAIN_OPTIONS", "any other train setting, as JSON: '{\"ema_decay\": 0.999}'"),
        Variable(
            "PRESET",
            "a training recipe: fast (cifar10_speedrun), airbench94, airbench94_muon, cifar10_speedrun or estimator",
        ),
        Variable("DATA_CHECK", "what a data-check error does: warn, block or fail (a schedule: block)"),
        Variable("DATA_THRESHOLDS", "the data check's thresholds by name, as JSON: '{\"channel_mean_shift\": 0.5}'"),
        Variable("LEAKAGE", "test images with a near-duplicate in training: keep, drop_from_train or drop_from_eval"),
        Variable("MODEL_REGISTRY", "Kubeflow's Model Registry (http(s)://HOST[:PORT]) to register promoted versions"),
        Variable("PROMOTION_ROOT", "where blessed models are promoted (local runs: OUTPUT/models)"),
        Variable("RESUME", "continue an interrupted run: its folder, its name, or last"),
        Variable("VERBOSE", "1: every line of every step, not only the progress"),
        Variable("EXTRA", "more options, as the program takes them: EXTRA='--resize 32x32 --validation-fraction 0.1'"),
        Variable("SPACE", "the search space: a JSON or YAML file, or inline JSON", SPACE_DEFAULT),
        Variable("TRIALS", "the search's budget in finished trials (4 for the demo, else 12)"),
        Variable("KFP_HOST", "the KFP endpoint (Kubeflow: https://<kubeflow>/pipeline)"),
        Variable("NAMESPACE", "your profile namespace on a multi-user Kubeflow (or KFP_NAMESPACE)"),
        Variable("EXPERIMENT", "the KFP experiment", "cifar10"),
        Variable("WAIT", "1: follow the run to its end; the exit code says how it ended"),
        Variable("CRON", "six fields, seconds first, as KFP reads them (or @daily, @every 6h)", "0 0 3 * * *"),
        Variable("NAME", "the recurring run's name (default: cifar10-pipeline-retraining)"),
        Variable("REPLACE", "1: a schedule of the same name is replaced (without it, refused)"),
        Variable("REMOVE", "1: leases removes the Leases whose documents the store no longer holds"),
        Variable("ENABLE", "the name of a schedule to enable"),
        Variable("DISABLE", "the name of a schedule to disable (its runs stop; it stays listed)"),
        Variable("DELETE", "the name of a schedule to delete"),
        Variable("LOGDIR", "the logs TensorBoard shows: a folder, gs:// or s3:// (default: OUTPUT)"),
        Variable("PORT", "TensorBoard's port", "6006"),
        Variable("KEEP", "clean-runs: keep the newest KEEP runs", "0"),
        Variable("ALL", "1: clean-runs removes interrupted runs too"),
        Variable("MODEL", "predict: a promotion root, a version folder or a SavedModel (default: OUTPUT/models)"),
        Variable("IMAGES", "predict: a folder of images, a prepared dataset, or a gs:// / s3:// prefix"),
        Variable("PREDICTIONS", "predict: the JSON Lines written (default: OUTPUT/predictions.jsonl)"),
        Variable("REGISTRY", "where the images are pushed and which the compiled pipelines name (run and schedule: "
                 "the registry pipeline/pipeline.yaml names, which make compile wrote)"),
        Variable("TAG", "the images' tag (default: derived from their content; run and schedule: a tag make "
                 "compile was given)"),
        Variable("ENGINE", "docker or podman (default: whichever can build)"),
        Variable("BASE_IMAGE", "the images' base (default: the Dockerfile's pinned one)"),
        Variable("CA_BUNDLE", "CA certificates for a network that re-signs TLS (a build secret)"),
        Variable("STAND_IN_BASE", "1: build the base from Debian packages (no registry reachable)"),
        Variable("VERSION", "serving-ops: the TensorFlow Serving release, e.g. 2.6.2"),
    )
}  # fmt: skip

# The pipeline's parameters a variable sets (local-run, sweep, run, schedule): given only when the variable is.
PIPELINE_OPTIONS = {
    "SOURCE": "--source", "WORKERS": "--workers", "DEPTH": "--depth", "BATCH_SIZE": "--batch-size",
    "TRAIN_STEPS": "--train-steps", "EPOCHS": "--epochs", "THRESHOLD": "--accuracy-threshold",
    "TRAIN_OPTIONS": "--train-options", "PRESET": "--preset", "DATA_CHECK": "--data-check",
    "DATA_THRESHOLDS": "--data-thresholds", "LEAKAGE": "--leakage",
    "MODEL_REGISTRY": "--model-registry", "PROMOTION_ROOT": "--promotion-root",
}  # fmt: skip
RUN_VARIABLES = (*PIPELINE_OPTIONS, "EXTRA")
LOCAL_VARIABLES = (*RUN_VARIABLES, "OUTPUT", "RUNNER", "RESUME", "VERBOSE", "REGISTRY", "TAG")
ENDPOINT_VARIABLES = ("KFP_HOST", "NAMESPACE", "EXPERIMENT")
IMAGE_VARIABLES = ("ENGINE", "BASE_IMAGE", "CA_BUNDLE", "REGISTRY", "TAG")


# Variables that switch an option on; as the programs read a boolean (components/common/config.py parse_bool).
FLAG_VARIABLES = ("VERBOSE", "WAIT", "REPLACE", "ALL", "STAND_IN_BASE")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class Values:
    """The variables given (on the command line, or exported in the environment) and their defaults."""

    def __init__(self, given: dict[str, str], environment: dict[str, str] | None = None):
        environment = os.environ if environment is None else environment
        self.given = {name: value for name, value in environment.items() if name in VARIABLES} | given

    def __getitem__(self, name: str) -> str:
        return self.given.get(name) or VARIABLES[name].default

    def has(self, name: str) -> bool:
        return bool(self.given.get(name, ""))

    def flag(self, name: str) -> bool:
        return self.given.get(name, "").strip().lower() in TRUE

    def flag_problem(self) -> str | None:
        """A flag variable given a value that is neither true nor false (VERBOSE=maybe, WAIT=yess): not read as no."""
        for name in FLAG_VARIABLES:
            value = self.given.get(name, "")
            if value.strip() and value.strip().lower() not in (*TRUE, *FALSE):
                return f"{name}: {value!r} is neither true ({', '.join(TRUE)}) nor false ({', '.join(FALSE)})"
        return None

    def extra(self) -> list[str]:
        return shlex.split(self.given.get("EXTRA", ""))

    def extra_problem(self) -> str | None:
        """EXTRA that cannot be split into words as a shell would, or whose JSON lost its double quotes in the
        splitting (EXTRA='--data-thresholds {"a": 1}' gives {a: and 1}): the program would refuse a mangled value."""
        text = self.given.get("EXTRA", "")
        try:
            words = shlex.split(text)
        except ValueError as error:  # an unclosed quote
            return f"EXTRA: {text!r} cannot be split into words as a shell would ({str(error).lower()})"
        mangled = [word for word in words if word.startswith(("{", "[")) and word not in text]
        if mangled:
            return (
                f"EXTRA: the JSON in it loses its double quotes when EXTRA is split into words ({mangled[0]!r}); "
                "give it its own variable (TRAIN_OPTIONS, DATA_THRESHOLDS, SPACE), or single quotes inside EXTRA"
            )
        return None


@dataclasses.dataclass(frozen=True)
class Command:
    module: str  # run as python -m MODULE
    arguments: list[str]
    environment: dict[str, str] = dataclasses.field(default_factory=dict)

    def shown(self) -> str:
        settings = [f"{name}={shlex.quote(value)}" for name, value in self.environment.items()]
        return (
            shlex.join(["python", "-m", self.module, *self.arguments])
            if not settings
            else " ".join([*settings, shlex.join(["python", "-m", self.module, *self.arguments])])
        )


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    help: str
    variables: tuple[str, ...] = ()
    commands: Callable[[Values], list[Command]] | None = None  # None: the Makefile's own recipe


# -- the commands each target runs ----------------------------------------------------------------------------------


def _images(values: Values) -> dict[str, str]:
    """The images' registry and tag, as the programs read them (components/images.py)."""
    settings = {}
    if values.has("REGISTRY"):
        settings["CIFAR10_PIPELINE_REGISTRY"] = values["REGISTRY"]
    if values.has("TAG"):
        settings["CIFAR10_PIPELINE_TAG"] = values["TAG"]
    return settings


def _pipeline_options(values: Values) -> list[str]:
    """The pipeline parameters the variables given set; the pipeline's own defaults hold for the rest."""
    options = []
    for name, option in PIPELINE_OPTIONS.items():
        if values.has(name):
            options += [option, values[name]]
    return options


def _named_in(extra: list[str], *options: str) -> bool:
    return any(word.split("=", 1)[0] in options for word in extra)


def _demo(values: Values, searched: frozenset[str] = frozenset()) -> list[str]:
    """make local-run is a quick demonstration unless told otherwise (a length, a preset, train options): 300 steps
    of a ResNet-8 (unless DEPTH is given) with a batch-norm decay of 0.9 (the estimator example's 0.997 needs
    thousands of steps before its moving averages are usable). A setting the search space searches (`searched`,
    make sweep) is left to the search."""
    extra = values.extra()
    options = []
    lengths = ("PRESET", "TRAIN_STEPS", "EPOCHS")
    if not any(values.has(name) for name in lengths) and not _named_in(extra, "--preset", "--train-steps", "--epochs"):
        if "train_steps" not in searched and "epochs" not in searched:
            options += ["--train-steps", "300"]
        if not values.has("DEPTH") and not _named_in(extra, "--depth") and "depth" not in searched:
            options += ["--depth", "8"]
    if (
        not values.has("TRAIN_OPTIONS")
        and not values.has("PRESET")
        and not _named_in(extra, "--train-options")
        and "batch_norm_decay" not in searched
    ):
        options += ["--train-options", '{"batch_norm_decay": 0.9}']
    return options


def _local(values: Values, pipeline: list[str], searched: frozenset[str] = frozenset()) -> list[str]:
    arguments = [*pipeline, "local-run", "--runner", values["RUNNER"], "--output-root", values["OUTPUT"]]
    arguments += _pipeline_options(values)
    if values.has("RESUME"):  # the run's own options hold; those given again must agree (local_run.resumed)
        arguments += ["--resume", values["RESUME"]]
    else:
        arguments += _demo(values, searched)
    return arguments + (["--verbose"] if values.flag("VERBOSE") else [])


def local_run(values: Values) -> list[Command]:
    return [Command("pipeline.pipeline", [*_local(values, []), *values.extra()], _images(values))]


def _searched(space: str) -> frozenset[str]:
    """The settings the search space names, so that the demo's own values leave them to the search: those of a
    valid space; of one the sweep will refuse (a bad range), the names it gives, so that its refusal is about the
    range, not about a demo value the user never gave; none when it cannot be read at all (the sweep says why)."""
    from components.common import documents, storage
    from components.sweep.space import read_space

    try:
        return frozenset(dimension.name for dimension in read_space(space).dimensions)
    except ValueError:
        pass
    text = space.strip()
    try:
        if text.startswith("{"):
            document = documents.load(text, "space", "search space", yaml_allowed=False)
        else:
            document = documents.load(storage.document_bytes(space, "search space"), space, "search space")
    except (ValueError, OSError):
        return frozenset()
    return frozenset(document) if isinstance(document, dict) else frozenset()


def sweep(values: Values) -> list[Command]:
    space = _in_repository(values["SPACE"], SPACE_DEFAULT)
    in_extra = _options_in(values.extra()).get("--space")
    searched = _searched(in_extra[0] or "" if in_extra else space)  # EXTRA='--space ...' is the space searched
    arguments = _local(values, ["sweep"], searched)
    if values.has("SPACE") or not values.has("RESUME"):  # a resumed sweep searches its own space unless one is given
        arguments += ["--space", space]
    if values.has("TRIALS") or not values.has("RESUME"):
        default = "12" if any(values.has(name) for name in ("PRESET", "TRAIN_STEPS", "EPOCHS")) else "4"
        arguments += ["--trials", values["TRIALS"] if values.has("TRIALS") else default]
    return [Command("pipeline.pipeline", [*arguments, *values.extra()], _images(values))]


def _in_repository(value: str, default: str) -> str:
    """The default file, found in the repository from any folder (make -C or -f)."""
    if value == default:
        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), default)
    return value


def _endpoint(values: Values) -> list[str]:
    arguments = ["--host", values["KFP_HOST"], "--experiment", values["EXPERIMENT"]]
    return arguments + (["--namespace", values["NAMESPACE"]] if values.has("NAMESPACE") else [])


def run(values: Values) -> list[Command]:
    arguments = ["run", *_endpoint(values), *(["--wait"] if values.flag("WAIT") else [])]
    return [Command("pipeline.pipeline", [*arguments, *_pipeline_options(values), *values.extra()], _images(values))]


def schedule(values: Values) -> list[Command]:
    arguments = ["schedule", *_endpoint(values), "--cron", values["CRON"]]
    arguments += ["--name", values["NAME"]] if values.has("NAME") else []
    arguments += ["--replace"] if values.flag("REPLACE") else []
    return [Command("pipeline.pipeline", [*arguments, *_pipeline_options(values), *values.extra()], _images(values))]


def schedules(values: Values) -> list[Command]:
    arguments = ["schedules", *_endpoint(values)]
    for name in ("ENABLE", "DISABLE", "DELETE"):
        if values.has(name):
            arguments += [f"--{name.lower()}", values[name]]
    return [Command("pipeline.pipeline", arguments)]


def compile_pipelines(values: Values) -> list[Command]:
    images = _images(values)
    return [Command("pipeline.pipeline", [*word, "compile"], images) for word in ([], ["predict"], ["sweep"])]


def clean_runs(values: Values) -> list[Command]:
    arguments = ["clean-runs", "--output-root", values["OUTPUT"], "--keep", values["KEEP"]]
    return [Command("pipeline.pipeline", arguments + (["--all"] if values.flag("ALL") else []))]


def tensorboard(values: Values) -> list[Command]:
    logdir = values["LOGDIR"] if values.has("LOGDIR") else values["OUTPUT"]
    return [Command("pipeline.pipeline", ["tensorboard", "--logdir", logdir, "--port", values["PORT"]])]


def _build(values: Values, push: bool) -> list[Command]:
    arguments = ["--push"] if push else []
    for name, option in (("ENGINE", "--engine"), ("BASE_IMAGE", "--base-image"), ("CA_BUNDLE", "--ca-bundle")):
        arguments += [option, values[name]] if values.has(name) else []
    arguments += ["--stand-in-base"] if values.flag("STAND_IN_BASE") else []
    return [Command("images.build", arguments, _images(values))]


def prepare_data(values: Values) -> list[Command]:
    source = values["SOURCE"] if values.has("SOURCE") else "synthetic"
    output = os.path.join(values["OUTPUT"], "dataset")
    return [Command("components.prepare_data", ["--source", source, "--output", output, *values.extra()])]


def predict(values: Values) -> list[Command]:
    model = values["MODEL"] if values.has("MODEL") else os.path.join(values["OUTPUT"], "models")
    output = values["PREDICTIONS"] if values.has("PREDICTIONS") else os.path.join(values["OUTPUT"], "predictions.jsonl")
    arguments = ["--model", model, "--images", values["IMAGES"], "--output", output]
    return [Command("components.predict", [*arguments, *values.extra()])]


def leases(values: Values) -> list[Command]:
    arguments = ["--namespace", values["NAMESPACE"]] if values.has("NAMESPACE") else []
    return [Command("pipeline.leases", arguments + (["--remove"] if values.flag("REMOVE") else []))]


def serving_ops(values: Values) -> list[Command]:
    return [Command("components.evaluate.serving_ops.generate", [values["VERSION"]])]


TARGETS = {
    target.name: target
    for target in (
        Target("help", "list the targets and their variables"),
        Target("install", "create VENV and install the pinned dependencies and this project", ("PYTHON",)),
        Target("constraints", "re-pin every installed package into constraints.txt", ("PYTHON",)),
        Target("test", "the whole test suite (but the container images': make test-images)"),
        Target("test-images", "build the images and run the pipeline in them (podman or Docker; docs/containers.md)"),
        Target("lint", "ruff check and format check; deptry; no reader outside the owners"),
        Target("format", "apply ruff fixes and formatting"),
        Target("local-run", "the whole pipeline on this machine", LOCAL_VARIABLES, local_run),
        Target("sweep", "search the train settings, then train, evaluate and promote the best",
               (*LOCAL_VARIABLES, "SPACE", "TRIALS"), sweep),
        Target("clean-runs", "remove finished runs' folders; promoted models stay", ("OUTPUT", "KEEP", "ALL"),
               clean_runs),
        Target("compile", "write pipeline/pipeline.yaml, predict.yaml and sweep.yaml (naming REGISTRY's images)",
               ("REGISTRY", "TAG"), compile_pipelines),
        Target("run", "submit a run to KFP_HOST (REGISTRY, TAG: as make compile wrote them)",
               (*ENDPOINT_VARIABLES, *RUN_VARIABLES, "WAIT", "REGISTRY", "TAG"), run),
        Target("schedule", "recurring retraining on KFP_HOST", (*ENDPOINT_VARIABLES, *RUN_VARIABLES, "CRON", "NAME",
                                                                "REPLACE", "REGISTRY", "TAG"), schedule),
        Target("schedules", "list the recurring runs on KFP_HOST; ENABLE, DISABLE or DELETE one by its name",
               (*ENDPOINT_VARIABLES, "ENABLE", "DISABLE", "DELETE"), schedules),
        Target("leases", "the pipeline's Leases in NAMESPACE whose documents the store no longer holds; REMOVE=1 "
               "removes them", ("NAMESPACE", "REMOVE"), leases),
        Target("tensorboard", "TensorBoard on a run's logs (local, gs:// or s3://)", ("LOGDIR", "OUTPUT", "PORT"),
               tensorboard),
        Target("images", "build the cpu and gpu images with Docker or podman", (*IMAGE_VARIABLES, "STAND_IN_BASE"),
               lambda values: _build(values, push=False)),
        Target("push", "build and push the images (then make compile REGISTRY=...)",
               (*IMAGE_VARIABLES, "STAND_IN_BASE"), lambda values: _build(values, push=True)),
        Target("prepare-data", "the prepare_data stage alone, into OUTPUT/dataset", ("SOURCE", "OUTPUT", "EXTRA"),
               prepare_data),
        Target("predict", "score images with the promoted model", ("MODEL", "IMAGES", "PREDICTIONS", "OUTPUT", "EXTRA"),
               predict),
        Target("serving-ops", "op definitions of a TensorFlow Serving release, from its own package", ("VERSION",),
               serving_ops),
        Target("bench", "every benchmark (needs ../shared/data; bench/predict.py a promoted model)"),
        Target("bench-sweep", "a sweep of 8 half-epoch trials around the fast recipe on real CIFAR-10"),
        Target("bench-scale", "prepare_data and the near-duplicate search at 60,000 and 600,000 images (about 20 min)"),
        Target("bench-accuracy", "cifar10_speedrun (fast) against airbench94_muon on real CIFAR-10 (an hour or more)"),
        Target(
            "bench-reference-setup",
            "a Python with PyTorch (CPU) in bench/work/reference-venv for the reference in bench/accuracy.py",
        ),
        Target("clean", "remove OUTPUT (promoted models too) and caches (not VENV)", ("OUTPUT",)),
    )
}  # fmt: skip
REQUIRED = {"predict": ("IMAGES", "give the images to score (a folder, a prepared dataset, a gs:// or s3:// prefix)"),
            "serving-ops": ("VERSION", "give the TensorFlow Serving release, e.g. VERSION=2.6.2")}  # fmt: skip


# -- checking what make was given ---------------------------------------------------------------------------------


def is_environment_setting(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in ENVIRONMENT_SETTINGS)


def problems(goals: Iterable[str], given: Iterable[str]) -> list[str]:
    """One line per variable given that no chosen target takes (misspelt, or for another target)."""
    goals = [goal for goal in goals if goal in TARGETS] or ["help"]
    taken = {name for goal in goals for name in (*TARGETS[goal].variables, *EVERY_TARGET)}
    found = []
    for name in given:
        if name in taken or (is_environment_setting(name) and name not in VARIABLES):
            continue
        targets = " ".join(goals)
        if name not in VARIABLES:
            near = difflib.get_close_matches(name, list(VARIABLES), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else " (make help lists them)"
            found.append(f"{name}: not a variable of this Makefile{hint}")
        else:
            users = [target.name for target in TARGETS.values() if name in target.variables] or ["none"]
            found.append(f"{name}: make {targets} does not use it; it is for: {', '.join(users)}")
    return found


def inherited_variables(target: str, given: dict[str, str], environment: dict[str, str] | None = None) -> list[str]:
    """The variables of `target` that come from the environment, not from the command line: said before the target
    runs (names only: a value may hold a credential)."""
    environment = os.environ if environment is None else environment
    return [name for name in TARGETS[target].variables if environment.get(name) and name not in given]


def describe() -> str:
    """make help: every target, what it does, and the variables it takes (with their defaults)."""
    lines = []
    for target in TARGETS.values():
        lines.append(f"{target.name:<22}{target.help}")
        if target.variables:
            lines.append(" " * 22 + "  " + " ".join(target.variables))
    lines += ["", "variables (default):"]
    for variable in VARIABLES.values():
        default = f" ({variable.default})" if variable.default else ""
        lines.append(f"  {variable.name:<18}{variable.help}{default}")
    lines.append("settings the programs read from the environment pass through: " + " ".join(ENVIRONMENT_SETTINGS))
    return "\n".join(lines)


# -- running a target ---------------------------------------------------------------------------------------------


def commands_of(target: str, values: Values) -> list[Command]:
    """The commands a target runs, EXTRA's options in place of the same ones before them (`with_extra`: a
    ValueError when a variable given sets one of them too)."""
    if target not in TARGETS or TARGETS[target].commands is None:
        raise KeyError(target)
    return [with_extra(command, values) for command in TARGETS[target].commands(values)]


def _option_at(words: list[str], index: int) -> tuple[str, str | None, int]:
    """The option at words[index] (`--name value`, `--name=value` or a flag): its name, its value, its word count."""
    name, equals, value = words[index].partition("=")
    if equals:
        return name, value, 1
    if index + 1 < len(words) and not words[index + 1].startswith("--"):
        return name, words[index + 1], 2
    return name, None, 1


def _options_in(words: list[str]) -> dict[str, tuple[str | None, str]]:
    """Each option `words` name: its (first) value, and its words as given."""
    options: dict[str, tuple[str | None, str]] = {}
    for index, word in enumerate(words):
        if word.startswith("--"):
            name, value, count = _option_at(words, index)
            options.setdefault(name, (value, shlex.join(words[index : index + count])))
    return options


def with_extra(command: Command, values: Values) -> Command:
    """EXTRA's options in place of the same options the command had before them: one a default set (RUNNER's, a
    demo's length) is dropped, so EXTRA's holds; one a variable given set (EPOCHS=2 and EXTRA='--epochs 3') is
    refused, as neither may be ignored in silence (the program would take the last)."""
    extra = values.extra()
    if not extra or command.arguments[len(command.arguments) - len(extra) :] != extra:
        return command
    in_extra = _options_in(extra)
    before, kept, index = command.arguments[: len(command.arguments) - len(extra)], [], 0
    while index < len(before):
        name, value, count = _option_at(before, index) if before[index].startswith("--") else ("", None, 1)
        if name not in in_extra:
            kept += before[index : index + count]
        elif value is not None:
            setters = [variable for variable, given in values.given.items() if variable != "EXTRA" and given == value]
            if setters:
                raise ValueError(
                    f"{setters[0]}={shlex.quote(value)} and EXTRA's {in_extra[name][1]} both set {name}: give it once"
                )
        index += count
    return dataclasses.replace(command, arguments=[*kept, *extra])


def _dry_run_by_make() -> bool:
    """make -n: make runs this recipe anyway (it is marked +) so that the commands it would run are shown."""
    flags = os.environ.get("MAKEFLAGS", "").split(" ", 1)[0]
    return bool(flags) and not flags.startswith("-") and "n" in flags


def parse_assignments(arguments: list[str]) -> tuple[dict[str, str], list[str]]:
    """NAME=value words (make's form) and the rest."""
    given, rest = {}, []
    for word in arguments:
        name, equals, value = word.partition("=")
        if equals and name.isidentifier() and name.upper() == name:
            given[name] = value
        else:
            rest.append(word)
    return given, rest


def clean_problem(output: str, repository: str) -> str | None:
    """Why `make clean` must not remove OUTPUT: nothing given, the file system's root, the home folder, the
    repository, the folder make runs in or one holding any of them, a file, or another git repository."""
    if not output.strip():
        return "OUTPUT is empty: give the folder the runs went to"
    path = os.path.realpath(os.path.expanduser(output))
    kept = {"the repository": repository, "the folder make runs in": os.getcwd(), "the home folder": "~", "/": "/"}
    for what, folder in kept.items():
        folder = os.path.realpath(os.path.expanduser(folder))
        if os.path.commonpath([path, folder]) == path:
            held = "is" if path == folder else "holds"
            return f"OUTPUT {output} {held} {what}{f' ({folder})' if what != '/' else ''}: it is not removed"
    if os.path.exists(path) and not os.path.isdir(path):
        return f"OUTPUT {output} is a file, not the folder the runs went to: it is not removed"
    if os.path.exists(os.path.join(path, ".git")):
        return f"OUTPUT {output} holds a git repository: it is not removed"
    return None


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["check-clean"]:  # check-clean OUTPUT REPOSITORY: before make clean removes anything
        problem = clean_problem(*arguments[1:3])
        if problem:
            print(f"make clean: {problem}", file=sys.stderr)
            return 2
        return 0
    if arguments[:1] == ["check"]:  # check GOAL... -- NAME...
        goals, _dashes, names = " ".join(arguments[1:]).partition(" -- ")
        for line in problems(goals.split(), names.split()):
            print(line)
            return 0  # make stops on the first; the line is its error
        return 0
    if arguments[:1] == ["help"]:
        print(describe())
        return 0
    given, rest = parse_assignments(arguments)
    dry_run = "--print" in rest or _dry_run_by_make()
    rest = [word for word in rest if word != "--print"]
    if "--given" in rest:  # from make: the names given on its command line; their values are in the environment
        index = rest.index("--given")
        given |= {name: os.environ.get(name, "") for name in rest[index + 1].split()}
        rest = rest[:index] + rest[index + 2 :]
    if len(rest) != 1 or rest[0] not in TARGETS or TARGETS[rest[0]].commands is None:
        runnable = ", ".join(name for name, target in TARGETS.items() if target.commands)
        print(f"python -m pipeline.make TARGET [NAME=value ...]: TARGET is one of {runnable}", file=sys.stderr)
        return 2
    target = rest[0]
    found = problems([target], [name for name in given if not is_environment_setting(name) or name in VARIABLES])
    values = Values({name: value for name, value in given.items() if name in VARIABLES})
    if target in REQUIRED and not values.has(REQUIRED[target][0]):
        found.append(f"{REQUIRED[target][0]}: {REQUIRED[target][1]}")
    found += [problem for problem in [values.flag_problem(), values.extra_problem()] if problem]
    if found:
        print(f"make {target}: {found[0]}", file=sys.stderr)
        return 2
    inherited = inherited_variables(target, given)
    if inherited:  # NAME, PORT, TAG...: names a shell may hold for something else (WSL sets NAME to the machine's)
        print(f"make {target}: {', '.join(inherited)} taken from your environment ({inherited[0]}= overrides)",
              file=sys.stderr)  # fmt: skip
    settings = {name: value for name, value in given.items() if name not in VARIABLES}  # KFP_TOKEN=... and such
    try:
        commands = commands_of(target, values)
    except ValueError as error:
        print(f"make {target}: {error}", file=sys.stderr)
        return 2
    if dry_run:
        print("\n".join(command.shown() for command in commands))
        return 0
    python = sys.executable  # make runs this module with VENV's Python
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the repository's own modules (images.build, which is no installed package) from any folder make runs in
    path = os.pathsep.join(filter(None, [repository, os.environ.get("PYTHONPATH", "")]))
    for index, command in enumerate(commands):
        environment = {**os.environ, **settings, **command.environment, "PYTHONPATH": path}
        if index == len(commands) - 1:  # the last (most often the only) command becomes this process: its signals,
            sys.stdout.flush()  # its exit code
            os.execve(python, [python, "-m", command.module, *command.arguments], environment)
        code = subprocess.call([python, "-m", command.module, *command.arguments], env=environment)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
