"""make's variables: one table (pipeline/make.py) says which variables each target takes and the option each becomes;
every pair reaches its program's own argument parser, and a variable no chosen target takes stops make naming it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import make

REPOSITORY = Path(__file__).resolve().parents[1]

# A value for each variable that its programs accept, and that can be found again in the command built from it.
SAMPLES = {
    "OUTPUT": "/tmp/sample-output", "SOURCE": "/tmp/sample-source.tar.gz", "RUNNER": "docker", "WORKERS": "4",
    "DEPTH": "14", "BATCH_SIZE": "96", "TRAIN_STEPS": "77", "EPOCHS": "7", "THRESHOLD": "0.61",
    "TRAIN_OPTIONS": '{"ema_decay": 0.99}', "PRESET": "airbench94", "DATA_CHECK": "block",
    "DATA_THRESHOLDS": '{"channel_mean_shift": 0.7}', "LEAKAGE": "drop_from_eval",
    "MODEL_REGISTRY": "http://127.0.0.1:9", "PROMOTION_ROOT": "/tmp/sample-models", "RESUME": "sample-run",
    "VERBOSE": "1", "EXTRA": "--source-sha256 abc", "SPACE": '{"depth": {"low": 8, "high": 20}}', "TRIALS": "9",
    "KFP_HOST": "http://127.0.0.1:8", "NAMESPACE": "sample-ns", "EXPERIMENT": "sample-experiment", "WAIT": "1",
    "CRON": "0 0 5 * * 1", "NAME": "sample-schedule", "REPLACE": "1", "ENABLE": "sample-a", "DISABLE": "sample-b",
    "DELETE": "sample-c", "REMOVE": "1", "LOGDIR": "/tmp/sample-logs", "PORT": "6123", "KEEP": "3", "ALL": "1",
    "MODEL": "/tmp/sample-model", "IMAGES": "/tmp/sample-images", "PREDICTIONS": "/tmp/sample.jsonl",
    "REGISTRY": "registry.example.com/sample", "TAG": "sample-tag", "ENGINE": "podman", "BASE_IMAGE": "sample:base",
    "CA_BUNDLE": "/tmp/sample-ca.pem", "STAND_IN_BASE": "1", "VERSION": "2.6.2", "PYTHON": "python3.99",
}  # fmt: skip
# How a flag variable shows in the command: the option it adds.
FLAGS = {"VERBOSE": "--verbose", "WAIT": "--wait", "REPLACE": "--replace", "ALL": "--all",
         "STAND_IN_BASE": "--stand-in-base", "REMOVE": "--remove"}  # fmt: skip
# Variables of several targets that only one of a pair can show at once (RESUME drops the demo's length, say) are still
# each checked alone; a variable that sets the images (REGISTRY, TAG) reaches the command through its environment.
IMAGE_SETTINGS = {"REGISTRY": "CIFAR10_PIPELINE_REGISTRY", "TAG": "CIFAR10_PIPELINE_TAG"}


def parser_of(command: make.Command):
    """The argument parser of the program the command runs (the real one)."""
    if command.module == "pipeline.pipeline":
        from pipeline import commands
        from pipeline.pipeline import PIPELINES, pipeline_named

        word = command.arguments[0] if command.arguments[0] in PIPELINES else None
        return commands.build_parser(pipeline_named(word)), command.arguments[1:] if word else command.arguments
    if command.module in ("components.predict", "components.prepare_data"):
        from components.common.config import build_parser
        from components.predict.config import PredictConfig
        from components.prepare_data.config import PrepareDataConfig

        config = PredictConfig if command.module == "components.predict" else PrepareDataConfig
        return build_parser(config, "test"), command.arguments
    if command.module == "images.build":
        from images.build import build_parser

        return build_parser(), command.arguments
    if command.module == "pipeline.leases":
        from pipeline.leases import build_parser

        return build_parser(), command.arguments
    if command.module == "components.evaluate.serving_ops.generate":
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("versions", nargs="+")
        return parser, command.arguments
    raise AssertionError(f"no parser known for {command.module}")


EXTRA = {"predict": "--top-k 5", "local-run": "--validation-fraction 0.1", "sweep": "--repeats 2"}


def sample(target: str, name: str) -> str:
    return EXTRA.get(target, SAMPLES[name]) if name == "EXTRA" else SAMPLES[name]


def given_for(target: str, name: str) -> dict[str, str]:
    given = {name: sample(target, name)}
    for required, _why in [make.REQUIRED[target]] if target in make.REQUIRED else []:
        given.setdefault(required, SAMPLES[required])
    return given


PAIRS = [
    (target.name, name) for target in make.TARGETS.values() if target.commands is not None for name in target.variables
]


@pytest.mark.parametrize(("target", "name"), PAIRS)
def test_every_variable_of_a_target_reaches_its_programs_parser(target, name):
    commands = make.commands_of(target, make.Values(given_for(target, name), environment={}))
    value = sample(target, name)
    reached = False
    for command in commands:
        parser, arguments = parser_of(command)
        parser.parse_args(arguments)  # the program takes the command as built (argparse exits 2 otherwise)
        words = command.arguments
        if name in IMAGE_SETTINGS:
            reached |= command.environment.get(IMAGE_SETTINGS[name]) == value
        elif name in FLAGS:
            reached |= FLAGS[name] in words
        elif name == "EXTRA":
            reached |= words[-2:] == value.split()
        else:
            reached |= value in words or any(word.startswith(value) for word in words)
    assert reached, f"make {target} {name}={value}: not in {[command.shown() for command in commands]}"


def test_an_option_a_variable_sets_and_extra_names_too_is_refused_and_a_default_gives_way_to_extra():
    """EXTRA naming an option a variable given sets (EPOCHS=2 and EXTRA='--epochs 3') is refused naming both: the
    program would take the last in silence. An option the command sets by default (RUNNER's, OUTPUT's, the demo's
    length) gives way to EXTRA's, which the program then reads once."""
    refused = gave_way = 0
    for target, name in [(target, name) for target, name in PAIRS if "EXTRA" in make.TARGETS[target].variables]:
        given = given_for(target, name)
        value = given[name]
        for command in make.commands_of(target, make.Values(given, environment={})):
            words = command.arguments
            if value not in words[1:] or not words[words.index(value, 1) - 1].startswith("--"):
                continue  # the variable sets no option of its own here (an environment setting, a derived path)
            option = words[words.index(value, 1) - 1]
            values = make.Values({**given, "EXTRA": f"{option} {shlex.quote(value + '0')}"}, environment={})
            refusal = rf"^{name}=.* and EXTRA's {option} .* both set {option}: give it once"
            with pytest.raises(ValueError, match=refusal):
                [make.with_extra(built, values) for built in make.commands_of(target, values)]
            refused += 1
        if name in (make.REQUIRED.get(target) or ("",))[:1]:
            continue
        without = {key: given_value for key, given_value in given.items() if key != name}
        for command in make.commands_of(target, make.Values(without, environment={})):
            defaults = [word for word in command.arguments if word.startswith("--")]
            for option in defaults:
                index = command.arguments.index(option)
                if index + 1 >= len(command.arguments) or command.arguments[index + 1].startswith("--"):
                    continue
                default = command.arguments[index + 1]
                if default in without.values():
                    continue  # a variable's, not a default
                values = make.Values({**without, "EXTRA": f"{option} {shlex.quote(default)}"}, environment={})
                for rebuilt in [make.with_extra(built, values) for built in make.commands_of(target, values)]:
                    parser, arguments = parser_of(rebuilt)
                    parser.parse_args(arguments)
                    assert rebuilt.arguments.count(option) == 1, rebuilt.shown()
                    gave_way += 1
    assert refused >= 20 and gave_way >= 20, (refused, gave_way)


def test_make_refuses_a_variable_and_extra_setting_one_option_before_anything_runs(tmp_path):
    ran = run_make("local-run", "EPOCHS=2", "EXTRA=--epochs 3", folder=tmp_path)
    assert ran.returncode == 2 and ran.stdout == ""
    refusal = "make local-run: EPOCHS=2 and EXTRA's --epochs 3 both set --epochs: give it once"
    assert ran.stderr.splitlines()[0] == refusal
    assert list(tmp_path.iterdir()) == []


def test_a_variable_no_chosen_target_takes_is_one_line_naming_the_targets_that_do():
    every = set(make.VARIABLES)
    for target in make.TARGETS.values():
        for name in sorted(every - set(target.variables) - set(make.EVERY_TARGET)):
            (line,) = make.problems([target.name], [name])
            users = [other.name for other in make.TARGETS.values() if name in other.variables]
            assert line == f"{name}: make {target.name} does not use it; it is for: {', '.join(users)}"
        assert make.problems([target.name], [*target.variables, *make.EVERY_TARGET, "KFP_TOKEN"]) == []
    assert make.problems(["local-run", "run"], ["WAIT", "RUNNER"]) == []  # each taken by one of the goals
    assert make.problems(["local-run"], ["EPOCH"]) == ["EPOCH: not a variable of this Makefile (did you mean EPOCHS?)"]


def run_make(*arguments: str, folder: Path = REPOSITORY) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPOSITORY / "Makefile"), *arguments, f"VENV={sys.prefix}"],
        capture_output=True, text=True, timeout=120, cwd=folder,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["local-run", "KFP_HOST=http://x"], "KFP_HOST: make local-run does not use it; it is for: run, schedule"),
        (["test", "EPOCHS=2"], "EPOCHS: make test does not use it; it is for: local-run, sweep, run, schedule"),
        (["run", "RESUME=last"], "RESUME: make run does not use it; it is for: local-run, sweep"),
        (["sweep", "SPAC=x.yaml"], "SPAC: not a variable of this Makefile (did you mean SPACE?)"),
    ],
)
def test_make_refuses_a_variable_before_anything_runs(tmp_path, arguments, expected):
    ran = run_make(*arguments, folder=tmp_path)
    assert ran.returncode == 2 and ran.stdout == ""
    (line,) = [line for line in ran.stderr.splitlines() if line.strip()]
    assert expected in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "arguments",
    [["local-run", "VERBOSE=maybe"], ["run", "KFP_HOST=http://127.0.0.1:1", "WAIT=yess"], ["clean-runs", "ALL=2"]],
)
def test_a_flag_neither_true_nor_false_is_refused_not_read_as_no(tmp_path, arguments):
    ran = run_make(*arguments, folder=tmp_path)
    name, value = arguments[-1].split("=")
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.splitlines()[0] == (
        f"make {arguments[0]}: {name}: {value!r} is neither true (1, true, yes, on) nor false (0, false, no, off)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('--data-thresholds {"channel_mean_shift": 0.5}', "the JSON in it loses its double quotes"),
        ('--run-name "nightly', "cannot be split into words as a shell would (no closing quotation)"),
    ],
)
def test_extra_that_the_splitting_would_mangle_is_refused_naming_the_way_that_works(tmp_path, extra, expected):
    ran = run_make("local-run", f"EXTRA={extra}", folder=tmp_path)
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.splitlines()[0].startswith("make local-run: EXTRA: ") and expected in ran.stderr
    assert list(tmp_path.iterdir()) == []
    quoted = run_make("-n", "local-run", """EXTRA=--data-thresholds '{"channel_mean_shift": 0.5}'""", folder=tmp_path)
    assert quoted.returncode == 0 and "--data-thresholds '{\"channel_mean_shift\": 0.5}'" in quoted.stdout


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["compile", "TAG=v1:2"], "TAG: 'v1:2' is not an image tag"),
        (
            ["compile", "REGISTRY=https://registry.example.com/team"],
            "REGISTRY: 'https://registry.example.com/team/cpu:",
        ),
        (["run", "KFP_HOST=http://127.0.0.1:1", "TAG=-rc"], "TAG: '-rc' is not an image tag"),
        (["push", "REGISTRY=registry.example.com/Team"], "REGISTRY: 'registry.example.com/Team/cpu:"),
    ],
)
def test_images_no_node_could_pull_are_refused_before_a_pipeline_names_them(tmp_path, arguments, expected):
    compiled = {path: path.read_bytes() for path in (REPOSITORY / "pipeline").glob("*.yaml")}
    ran = run_make(*arguments, folder=tmp_path)
    assert ran.returncode == 2 and ran.stdout == ""
    assert expected in ran.stderr.splitlines()[0] and "Traceback" not in ran.stderr
    assert {path: path.read_bytes() for path in compiled} == compiled


def test_the_makefile_and_the_table_name_the_same_targets_and_variables():
    makefile = (REPOSITORY / "Makefile").read_text()
    rules = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    programs = set(re.search(r"^PROGRAMS := ((?:.*\\\n)*.*)$", makefile, re.MULTILINE).group(1).replace("\\\n", " ")
                   .split())  # fmt: skip
    assert rules - {"$(PROGRAMS)"} | programs == set(make.TARGETS)
    assert programs == {name for name, target in make.TARGETS.items() if target.commands is not None}
    # each recipe the Makefile writes out uses only its own variables, and those the table gives it
    recipes = re.findall(r"^([a-z][a-z-]*):[^\n]*\n((?:\t[^\n]*\n)*)", makefile, re.MULTILINE)
    internal = {"ROOT", "BIN", "VENV", "PYTHON", "PROGRAMS", "GIVEN_VARIABLES"}
    for name, recipe in recipes:
        used = set(re.findall(r"\$\(([A-Z_]+)\)", recipe)) - internal
        assert used <= set(make.TARGETS[name].variables), (name, used)


def test_a_variable_taken_from_the_environment_is_said_by_name(tmp_path):
    """make takes an exported variable as if given; a shell may hold NAME or PORT for something else (WSL sets NAME
    to the machine's name, which would name the schedule). The names are said; a value given on the command line
    wins and is not said."""
    environment = {**os.environ, "PORT": "8080", "NAME": "DESKTOP-1234"}
    ran = subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPOSITORY / "Makefile"), "-n", "tensorboard", f"VENV={sys.prefix}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environment,
    )  # fmt: skip
    assert ran.returncode == 0 and "--port 8080" in ran.stdout, ran.stderr
    assert ran.stderr.strip() == "make tensorboard: PORT taken from your environment (PORT= overrides)"
    assert make.inherited_variables("schedule", {}, environment) == ["NAME"]
    assert make.inherited_variables("schedule", {"NAME": "nightly"}, environment) == []


def test_make_n_shows_the_command_a_target_runs(tmp_path):
    ran = run_make("-n", "local-run", "EPOCHS=1", folder=tmp_path)
    assert ran.returncode == 0, ran.stderr
    (command,) = [line for line in ran.stdout.splitlines() if line.startswith("python -m pipeline.pipeline")]
    assert "--epochs 1" in command and "--train-steps" not in command
    assert list(tmp_path.iterdir()) == []  # shown, not run
    demo = make.commands_of("local-run", make.Values({}, environment={}))[0].arguments
    assert demo[demo.index("--train-steps") + 1] == "300" and demo[demo.index("--depth") + 1] == "8"
    resumed = make.commands_of("local-run", make.Values({"RESUME": "last"}, environment={}))[0].arguments
    assert "--train-steps" not in resumed and resumed[resumed.index("--resume") + 1] == "last"


def test_a_resumed_sweep_is_given_only_what_the_user_gave():
    """`make sweep RESUME=last` (docs/sweep.md) continues with the study's own space and budget: make passes no
    default of its own as if the user gave it; a SPACE or TRIALS given anew is passed, for the sweep to check."""
    resumed = make.commands_of("sweep", make.Values({"RESUME": "last"}, environment={}))[0].arguments
    assert "--space" not in resumed and "--trials" not in resumed and "--resume" in resumed
    given = make.commands_of("sweep", make.Values({"RESUME": "last", "SPACE": "my.yaml", "TRIALS": "9"},
                                                  environment={}))[0].arguments  # fmt: skip
    assert given[given.index("--space") + 1] == "my.yaml" and given[given.index("--trials") + 1] == "9"
    fresh = make.commands_of("sweep", make.Values({}, environment={}))[0].arguments
    assert fresh[fresh.index("--space") + 1].endswith("pipeline/sweep_space.yaml") and "--trials" in fresh


def test_the_images_setting_reaches_the_image_builder():
    (command,) = make.commands_of("images", make.Values({"REGISTRY": "registry.example.com/ml"}, environment={}))
    shown = subprocess.run(
        [sys.executable, "-m", "images.build", "--print-references"],
        env={**__import__("os").environ, **command.environment}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert all(reference.startswith("registry.example.com/ml/") for reference in json.loads(shown.stdout).values())


def test_the_compiled_pipelines_carry_each_setting_with_its_type():
    """What a cluster runs: every pipeline parameter and component input typed as the Python signature says (an
    integer is NUMBER_INTEGER, which KFP's launcher hands over as an integer), an integer's default integral, and a
    dict parameter's default (a STRUCT, whose numbers travel as doubles) read back as the same settings."""
    import inspect

    import yaml

    from components.common.kfp_parameters import as_delivered
    from components.sweep.space import parse_space
    from pipeline import commands
    from pipeline.pipeline import pipeline_named

    kinds = {int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", bool: "BOOLEAN", str: "STRING", dict: "STRUCT"}
    for word in (None, "sweep", "predict"):
        pipeline = pipeline_named(word)
        spec = next(yaml.safe_load_all(commands.compiled_path(pipeline).read_text()))
        declared = spec["root"]["inputDefinitions"]["parameters"]
        signature = inspect.signature(pipeline.pipeline_func).parameters
        for name, parameter in signature.items():
            assert declared[name]["parameterType"] == kinds[parameter.annotation], (pipeline.name, name)
            default = declared[name].get("defaultValue")
            if parameter.annotation is int:
                assert float(default).is_integer() and int(default) == parameter.default, (pipeline.name, name)
        if "space" in declared:
            documented = declared["space"]["defaultValue"]
            assert parse_space(as_delivered(documented), "space") == parse_space(documented, "space")


def test_make_clean_refuses_a_folder_that_is_not_the_runs_and_removes_nothing(tmp_path):
    """`make clean` removes OUTPUT whole: OUTPUT=.. (or a typo naming a parent, the home folder, a file, another
    repository) had been `rm -rf` on it. Refused in one line, exit 2, before anything is removed. Only refusals are run
    here: a clean that goes ahead would remove the repository's caches and bench/work."""
    here = tmp_path / "project"
    (here / "outputs").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "other" / ".git").mkdir(parents=True)
    cases = {
        str(tmp_path): "holds the folder make runs in",
        ".": "is the folder make runs in",
        str(REPOSITORY.parent): "holds the repository",
        str(tmp_path / "notes.txt"): "is a file, not the folder the runs went to",
        str(tmp_path / "other"): "holds a git repository",
        "": "OUTPUT is empty",
    }
    for output, said in cases.items():
        result = run_make("clean", f"OUTPUT={output}", folder=here)
        assert result.returncode == 2 and said in result.stderr, (output, result.stderr)
        assert "rm -rf" not in result.stdout
    assert (tmp_path / "notes.txt").read_text() == "keep me" and (here / "outputs").is_dir()
    assert (tmp_path / "other" / ".git").is_dir()
    shown = run_make("-n", "clean", "OUTPUT=my outputs", folder=here).stdout
    assert 'rm -rf "my outputs"' in shown  # one folder, its name with a space, never a glob or two words


def test_make_sweep_leaves_a_searched_setting_to_the_search_and_refuses_one_given():
    """The demo's own settings (a ResNet-8, a batch-norm decay) give way to the search space's; one the user gives
    that the space also searches is refused, naming both, where the search's choice had replaced it in silence."""
    from pipeline import commands
    from pipeline.parameters import CommandError, check_parameters
    from pipeline.pipeline import pipeline_named

    sweep_pipeline = pipeline_named("sweep")
    space = '{"depth": {"low": 8, "high": 20, "step": 6}, "batch_norm_decay": {"choices": [0.9, 0.99]}}'

    def checked(given: dict[str, str]) -> dict:
        values = make.Values(given, environment={})
        (command,) = [make.with_extra(built, values) for built in make.commands_of("sweep", values)]
        parser, arguments = parser_of(command)
        parameters = commands.chosen_parameters(parser.parse_args(arguments), sweep_pipeline)
        check_parameters(sweep_pipeline, parameters)
        return parameters

    parameters = checked({"SPACE": space})
    assert "depth" not in parameters and "batch_norm_decay" not in parameters.get("train_options", {})
    assert parameters["train_steps"] == 300  # the demo's length holds
    assert checked({})["depth"] == 8  # the default space does not search depth
    assert "depth" not in checked({"EXTRA": f"--space '{space}'"})  # a space given in EXTRA is the one searched
    searched = r" is given, and the search space searches {0} \(.*\): .*leave it out, or take {0} out of the space$"
    with pytest.raises(CommandError, match="^depth: 20" + searched.format("depth")):
        checked({"SPACE": space, "DEPTH": "20"})
    # a resumed run's own record (an earlier release's make sweep gave the demo's depth with a space searching it)
    check_parameters(sweep_pipeline, {"depth": 8, "space": json.loads(space)}, resumed=True)
    given_decay = "^train_options' batch_norm_decay: 0.95"
    with pytest.raises(CommandError, match=given_decay + searched.format("batch_norm_decay")):
        checked({"SPACE": space, "TRAIN_OPTIONS": '{"batch_norm_decay": 0.95}'})


def test_a_space_the_sweep_will_refuse_keeps_the_demo_off_the_settings_it_names():
    """A bad range for depth, no TRAIN_STEPS: the demo does not add its own --depth, so the sweep's refusal is the
    range's, not "depth: 8 is given" of a value the user never gave."""
    bad = '{"depth": {"low": 8, "high": 21, "step": 6}}'
    arguments = make.commands_of("sweep", make.Values({"SPACE": bad}, environment={}))[0].arguments
    assert "--depth" not in arguments and arguments[arguments.index("--space") + 1] == bad


def test_make_help_runs_before_make_install_on_a_python_without_the_projects_packages(tmp_path):
    """`make help` runs on the system's python3 ($(PYTHON)), before `make install` made the environment: make.py may
    import the project's modules only inside the targets that need them. The stand-in is this Python isolated from
    its site-packages and the repository (-I -S), so that neither the project nor its dependencies can be imported."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(REPOSITORY / "pipeline" / "make.py"), "help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "bench-scale" in result.stdout and "local-run" in result.stdout
