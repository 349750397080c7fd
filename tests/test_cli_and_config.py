"""The command line and configuration every stage shares, shown on prepare_data."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from components.common import filesystem
from components.common.config import config_from_mapping, config_to_dict, parse_config
from components.common.dataset import open_dataset
from components.prepare_data.__main__ import main
from components.prepare_data.config import PrepareDataConfig

REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Example:
    name: str = field(metadata={"help": "a name"})
    count: int = 3
    ratio: float | None = None
    enabled: bool = True
    tags: tuple[str, ...] = ()


def test_options_parse_to_typed_fields_and_file_values_are_overridden_by_the_command_line(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"name": "from-file", "count": 7, "tags": ["a", "b"]}))

    config, _ = parse_config(
        Example, ["--config", str(config_file), "--count", "9", "--no-enabled", "--ratio", "0.5"], "test"
    )

    assert config == Example(name="from-file", count=9, ratio=0.5, enabled=False, tags=("a", "b"))
    assert config_to_dict(config)["tags"] == ["a", "b"]


def test_unknown_field_in_a_config_file_names_the_file_and_the_field(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"name": "x", "cuont": 1}))
    with pytest.raises(
        ValueError, match=rf"{config_file}.*unknown configuration field\(s\) 'cuont' \(did you mean 'count'\?\)"
    ):
        parse_config(Example, ["--config", str(config_file)], "test")


def test_missing_required_field_is_an_error_that_names_it():
    with pytest.raises(ValueError, match="name"):
        config_from_mapping(Example, {}, "command line")


def test_cli_help_lists_the_options():
    result = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--help"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    )
    for option in ("--source", "--output", "--validation-fraction", "--examples-per-shard", "--compression"):
        assert option in result.stdout


def test_cli_bad_input_exits_2_with_one_clear_line_and_publishes_nothing(tmp_path, capsys):
    junk = tmp_path / "cifar.tar.gz"
    junk.write_bytes(b"not an archive")
    code = main(["--source", str(junk), "--output", str(tmp_path / "out")])
    assert code == 2
    assert f"{junk}: not a readable tar archive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_bad_option_value_names_the_field(tmp_path, capsys):
    code = main(["--source", "synthetic", "--output", str(tmp_path / "out"), "--validation-fraction", "2"])
    assert code == 2
    assert "validation_fraction: 2.0 is not in [0, 1)" in capsys.readouterr().err


def test_cli_runs_the_stage(tmp_path):
    code = main(["--source", "synthetic", "--output", str(tmp_path / "out"), "--synthetic-train-per-class", "3"])
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["parameters"]["synthetic_train_per_class"] == 3
    verified = open_dataset(str(tmp_path / "out"))
    classes = len(verified.manifest.label_names)
    assert sum(verified.manifest.splits[name].num_examples for name in ("train", "validation")) == 3 * classes


@pytest.mark.parametrize(
    ("stage", "values", "message"),
    [
        ("train", {"schedule": "exponential"}, "schedule: 'exponential' is not one of piecewise, cosine, triangular"),
        ("train", {"launcher": "bogus"}, "launcher: 'bogus' is not one of"),
        ("train", {"augment": "false"}, "augment: 'false' is not true or false"),
        ("train", {"depth": "20"}, "depth: '20' is not an integer"),
        ("train", {"learning_rate": 0}, r"learning_rate: 0(\.0)? is not in \(0, inf\)"),
        ("train", {"learning_rate": float("nan")}, "learning_rate: (nan|NaN) is not a finite number"),
        ("train", {"momentum": 1.5}, r"momentum: 1.5 is not in \[0, 1\)"),
        ("train", {"width_multiplier": 1e-9}, r"width_multiplier: 1e-09 is not in \[0.0625, 16\]"),
        ("train", {"checkpoint_every_seconds": -1}, r"checkpoint_every_seconds: -1(\.0)? is not in \(0, inf\)"),
        ("train", {"boundary_epochs": (1.0, -2.0)}, r"boundary_epochs: -2.0 is not in \[0, inf\)"),
        ("evaluate", {"mode": "everything"}, "mode: 'everything' is not one of"),
        ("prepare_data", {"examples_per_shard": True}, "examples_per_shard: True is not an integer"),
        # a location of a scheme no reader serves would be taken for a local folder named "ftp:", "S3:"...
        ("train", {"warm_start": "ftp://host/model"}, "warm_start: 'ftp://host/model': ftp:// is not a scheme"),
        ("evaluate", {"promote_to": "S3://bucket/models"}, "promote_to: 'S3://bucket/models': S3:// is not a scheme"),
        ("prepare_data", {"source": "file:///data/cifar"}, "source: 'file:///data/cifar': file:// is not a scheme"),
    ],
)
def test_every_config_path_refuses_wrong_types_and_values(tmp_path, stage, values, message):
    """The same check on every path: a --config file, the dataclass built directly, and KFP options."""
    from components.common.config import config_from_mapping
    from components.evaluate.config import EvaluateConfig
    from components.train.config import TrainConfig

    config_class, required = {
        "train": (TrainConfig, {"data": "d", "model_dir": "m"}),
        "evaluate": (EvaluateConfig, {"data": "d", "model_dir": "m"}),
        "prepare_data": (PrepareDataConfig, {"output": "o"}),
    }[stage]
    with pytest.raises(ValueError, match=message):
        config_class(**required, **values)
    with pytest.raises(ValueError, match=message):
        config_from_mapping(config_class, {**required, **values}, "KFP options")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**required, **values}, allow_nan=True))
    completed = subprocess.run(
        [sys.executable, "-m", f"components.{stage}", "--config", str(path)],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2 and re.search(message, completed.stderr), completed.stderr[-1500:]
    assert "Traceback" not in completed.stderr


def test_numbers_from_kfp_parameters_keep_their_meaning():
    """KFP carries dict parameters as protobuf Structs, where every number is a float."""
    from components.common.config import config_from_mapping
    from components.train.config import TrainConfig

    config = config_from_mapping(
        TrainConfig,
        {"data": "d", "model_dir": "m", "log_every_steps": 10.0, "profile_steps": [2.0, 3.0], "learning_rate": 1},
        "KFP options",
    )
    assert config.log_every_steps == 10 and config.profile_steps == (2, 3) and config.learning_rate == 1.0
    with pytest.raises(ValueError, match=r"log_every_steps: 10.5 is not an integer"):
        config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "log_every_steps": 10.5}, "KFP options")


def test_kfp_options_cannot_override_the_steps_named_parameters():
    from types import SimpleNamespace

    from components.train.kfp_run import training_configs

    dataset = SimpleNamespace(uri="/d", path="/d", name="dataset", metadata={})
    model = SimpleNamespace(uri="/m", path="/m", name="model", metadata={})
    with pytest.raises(ValueError, match=r"options: \['depth'\] are parameters of the step"):
        training_configs(dataset, model, "auto", model_dir="", depth=20, options={"depth": 56}, run_id="")
    with pytest.raises(ValueError, match=r"options: \['worker_cpu'\] are parameters of the step"):
        training_configs(dataset, model, "auto", model_dir="", worker_cpu="2", options={"worker_cpu": "8"}, run_id="")


def test_evaluate_imports_nothing_from_train():
    """The stages stand side by side over common/: evaluate reads a model directory through
    components/common/model_directory.py and builds the model through components/common/model.py."""
    import ast

    imported = set()
    for path in (REPOSITORY / "components" / "evaluate").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("components.train"):
                imported.add((path.name, node.module))
            if isinstance(node, ast.Import):
                imported.update(
                    (path.name, alias.name) for alias in node.names if alias.name.startswith("components.train")
                )
    assert not imported, sorted(imported)


def test_kfp_parameters_read_not_given_as_the_configs_default():
    from components.common.kfp_parameters import config_from_parameters, parameter_defaults
    from components.train.config import TrainConfig

    defaults = parameter_defaults(TrainConfig)
    assert (defaults.depth, defaults.train_steps, defaults.epochs, defaults.warm_start) == (20, -1, -1.0, "")
    assert not hasattr(defaults, "data")  # required: no default to offer
    given = {"data": "d", "model_dir": "m", "train_steps": -1, "epochs": 2.0, "warm_start": "", "depth": 8}
    config = config_from_parameters(TrainConfig, given, "component parameters")
    assert (config.train_steps, config.epochs, config.warm_start, config.depth) == (None, 2.0, None, 8)
    # A placeholder is "not given" only for a field whose default is None; elsewhere the field's own check speaks.
    with pytest.raises(ValueError, match=r"component parameters: depth: -1"):
        config_from_parameters(TrainConfig, {**given, "depth": -1}, "component parameters")
    with pytest.raises(ValueError, match=r"component parameters: train_steps: 0 is not in \[1, "):
        config_from_parameters(TrainConfig, {**given, "epochs": -1.0, "train_steps": 0}, "component parameters")


def test_a_preset_supplies_every_value_not_given_on_every_config_path(tmp_path):
    """--preset fast is the fastest recipe's values: the values given (command line, file, KFP parameters) win, a length
    given by hand replaces the preset's, and the KFP parameters left at their defaults take the preset's."""
    from components.common.config import parse_config
    from components.common.kfp_parameters import config_from_parameters
    from components.evaluate.config import EvaluateConfig
    from components.train.config import TrainConfig
    from components.train.presets import FAST

    config, _ = parse_config(TrainConfig, ["--data", "d", "--model-dir", "m", "--preset", "fast"], "train")
    assert {name: getattr(config, name) for name in FAST} == FAST
    assert (config.model, config.batch_size, config.epochs, config.train_steps) == (
        FAST["model"], FAST["batch_size"], FAST["epochs"], None
    )  # fmt: skip

    argv = ["--data", "d", "--model-dir", "m", "--preset", "fast", "--batch-size", "512", "--train-steps", "100"]
    config, _ = parse_config(TrainConfig, argv, "train")
    assert (config.batch_size, config.train_steps, config.epochs, config.nesterov) == (512, 100, None, True)

    estimator, _ = parse_config(TrainConfig, ["--data", "d", "--model-dir", "m", "--preset", "estimator"], "train")
    assert estimator == TrainConfig(data="d", model_dir="m", preset="estimator")  # the defaults, named

    # KFP: every parameter arrives; those at their defaults (batch_size 128 here) take the preset's value.
    parameters = {"data": "d", "model_dir": "m", "preset": "fast", "batch_size": 128, "depth": 20, "epochs": -1.0,
                  "learning_rate": 0.05, "train_steps": -1}  # fmt: skip
    config = config_from_parameters(TrainConfig, parameters, "train component parameters")
    assert (config.batch_size, config.learning_rate, config.epochs) == (FAST["batch_size"], 0.05, FAST["epochs"])

    assert (
        parse_config(EvaluateConfig, ["--data", "d", "--model-dir", "m", "--preset", "fast"], "evaluate")[
            0
        ].test_time_augmentation
        == "mirror_translate"
    )
    with pytest.raises(
        ValueError,
        match=r"preset: 'quick' is not one of fast, airbench94, airbench94_muon, cifar10_speedrun, estimator",
    ):
        TrainConfig(data="d", model_dir="m", preset="quick")
    completed = subprocess.run(
        [sys.executable, "-m", "components.train", "--data", "d", "--model-dir", "m", "--preset", "quick"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2 and "preset" in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("launcher", "said"), [("local", "launcher local starts none"), ("auto", "launcher auto (here: inprocess)")]
)
def test_a_cluster_jobs_setting_given_to_a_launcher_that_starts_none_is_refused(tmp_path, launcher, said):
    """The train stage's command line: the workers' pod settings, the job's queue or timeout mean nothing when the
    workers are processes of this machine; one line naming them, exit 2, nothing written."""
    completed = subprocess.run(
        [sys.executable, "-m", "components.train", "--data", str(tmp_path / "data"), "--model-dir",
         str(tmp_path / "model"), "--launcher", launcher, "--workers", "2" if launcher == "local" else "1",
         "--worker-memory", "64Gi", "--queue-name", "team", "--job-timeout-seconds", "600"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (line,) = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert "--worker-memory, --queue-name, --job-timeout-seconds: settings of a cluster job" in line, line
    assert said in line and not (tmp_path / "model").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--timeout-seconds", "60"], "timeout_seconds: how continuous mode waits for checkpoints, and mode latest"),
        (["--mode", "all", "--checkpoint", "ckpt-5"],
         "checkpoint: ckpt-5 names the checkpoint to evaluate, and mode all"),
        (["--serving-version", "2.21.0", "--registered-model-name", "flowers"],
         "serving_version, registered_model_name: settings of a promotion, and promote_to is not given"),
        (["--baseline-tolerance", "0.01"],
         "baseline_tolerance: how far below the baseline a model may be, and there is none (baseline, compare_with"),
    ],
    ids=["wait, once", "checkpoint and mode", "promotion, no root", "tolerance, no baseline"],
)  # fmt: skip
def test_an_evaluate_setting_another_makes_it_ignore_is_refused(tmp_path, options, message):
    """The evaluate stage's command line: a setting that the mode, or a missing promotion root or baseline, would
    make it ignore is one line naming both, exit 2, before anything is read or written."""
    completed = subprocess.run(
        [sys.executable, "-m", "components.evaluate", "--data", str(tmp_path / "data"), "--model-dir",
         str(tmp_path / "model"), *options],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (line,) = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2 and "Traceback" not in completed.stderr and message in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_files_setting_with_the_synthetic_source_is_refused_on_the_command_line_and_in_a_pipeline(tmp_path):
    """source synthetic is generated: a layout or a digest to check would be ignored; the stage and a pipeline's
    submission both refuse it, naming it."""
    from pipeline.parameters import CommandError, check_parameters
    from pipeline.training_pipeline import cifar10_pipeline

    completed = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--source", "synthetic", "--output", str(tmp_path / "out"),
         "--source-format", "python"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2 and "source_format: a setting of a source that is read" in completed.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(CommandError, match=r"source_sha256: a setting of a source that is read .* source synthetic"):
        check_parameters(cifar10_pipeline, {"source": "synthetic", "source_sha256": "a" * 64})
    check_parameters(cifar10_pipeline, {"source": "s3://bucket/cifar-10-python.tar.gz", "source_sha256": "a" * 64})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"optimizer": "adam", "momentum": 0.8}, "momentum: a setting of optimizers sgd, rmsprop and muon"),
        ({"muon_learning_rate": 0.1, "newton_schulz_steps": 5}, "muon_learning_rate, newton_schulz_steps: settings "
         "of optimizer muon"),
        ({"schedule": "cosine", "boundary_epochs": [1.0], "decay_factors": [0.1]}, "boundary_epochs, decay_factors: "
         "settings of schedule piecewise"),
        ({"triangle_peak": 0.3}, "triangle_peak: a setting of schedule triangular"),
        ({"lookahead_decay": 0.9}, "lookahead_decay: a setting of lookahead_every_steps"),
        ({"whitening_bias_epochs": 1.0}, "whitening_bias_epochs: a setting of the airbench models' whitening layer"),
        ({"preset": "airbench94_muon", "optimizer": "adam", "momentum": 0.5}, "momentum: a setting of optimizers"),
    ],
    ids=["momentum, adam", "muon's, sgd", "piecewise's, cosine", "triangle, piecewise", "lookahead, none",
         "whitening, resnet", "over a preset"],
)  # fmt: skip
def test_a_train_setting_its_optimizer_schedule_or_model_would_ignore_is_refused_everywhere(tmp_path, values, message):
    """What the optimizer, schedule or model in use has no use for: refused by the stage's config (the command line,
    a --config file, a pipeline's TRAIN_OPTIONS at submission), naming it. A preset's own values are not 'given':
    airbench94_muon with another optimizer keeps its muon settings unused without a word."""
    from components.common.config import config_from_mapping
    from components.train.config import TrainConfig
    from pipeline.parameters import CommandError, check_parameters
    from pipeline.training_pipeline import cifar10_pipeline

    with pytest.raises(ValueError, match=re.escape(message)):
        config_from_mapping(TrainConfig, {"data": "/d", "model_dir": "/m", **values}, "configuration")
    options = {name: value for name, value in values.items() if name != "preset"}
    preset = {"preset": values["preset"]} if "preset" in values else {}
    with pytest.raises(CommandError, match=re.escape(message)):
        check_parameters(cifar10_pipeline, {"source": "synthetic", "train_options": options, **preset})
    config_from_mapping(TrainConfig, {"data": "/d", "model_dir": "/m", "preset": "airbench94_muon", "optimizer": "sgd"},
                        "configuration")  # fmt: skip


def _numeric_fields():
    import dataclasses
    import typing

    from components.common.config import _unwrap_optional
    from components.evaluate.config import EvaluateConfig
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig

    for config_class in (TrainConfig, LaunchConfig, EvaluateConfig, PrepareDataConfig):
        hints = typing.get_type_hints(config_class)
        for field_ in dataclasses.fields(config_class):
            annotation, _optional = _unwrap_optional(hints[field_.name])
            is_tuple = typing.get_origin(annotation) is tuple
            element = typing.get_args(annotation)[0] if is_tuple else annotation
            if element in (int, float):
                yield pytest.param(config_class, field_, element, is_tuple, id=f"{config_class.__name__}.{field_.name}")


@pytest.mark.parametrize(("config_class", "field_", "element", "is_tuple"), list(_numeric_fields()))
def test_every_number_of_every_config_has_an_interval_that_is_enforced(config_class, field_, element, is_tuple):
    """No number is accepted quietly: each declares the interval it may take, and a value just outside is refused
    by the same check on every path."""
    from components.common.values import _INTERVAL

    required = {
        "PrepareDataConfig": {"output": "o"},
        "LaunchConfig": {},
    }.get(config_class.__name__, {"data": "d", "model_dir": "m"})
    interval = field_.metadata.get("range")
    assert interval, f"{field_.name} declares no range"
    opening, low, high, closing = _INTERVAL.fullmatch(interval).groups()
    outside = [float(low) if opening == "(" else float(low) - 1]
    if high != "inf":
        outside.append(float(high) if closing == ")" else float(high) + 1)
    for value in outside:
        given = element(value)
        with pytest.raises(ValueError, match=rf"{field_.name}: .* is not in {re.escape(interval)}"):
            config_class(**required, **{field_.name: (given,) if is_tuple else given})


@pytest.mark.parametrize("program", ["components.train", "components.evaluate", "components.prepare_data"])
def test_help_lists_every_choice_and_one_default_per_option(program):
    import dataclasses
    import typing

    help_text = subprocess.run(
        [sys.executable, "-m", program, "--help"], capture_output=True, text=True, cwd=REPOSITORY, timeout=120
    ).stdout
    entries = [" ".join(entry.split()) for entry in re.split(r"\n  (?=--)", help_text)]  # one per option
    for entry in entries:  # a default said once: by the help's own words, or as the value
        assert entry.count("(default") <= 1 and not ("by default" in entry and "(default:" in entry), entry
    classes = {
        "components.train": ("components.train.config", "TrainConfig"),
        "components.evaluate": ("components.evaluate.config", "EvaluateConfig"),
        "components.prepare_data": ("components.prepare_data.config", "PrepareDataConfig"),
    }
    module, name = classes[program]
    config_class = getattr(__import__(module, fromlist=[name]), name)
    assert typing.get_type_hints(config_class)
    flat = " ".join(help_text.split())
    for field_ in dataclasses.fields(config_class):
        for choice in field_.metadata.get("choices", ()):
            assert str(choice) in flat, f"--{field_.name} does not list {choice}"


def test_local_run_help_describes_its_options_and_the_default_make_local_run_uses():
    help_text = " ".join(
        subprocess.run(
            [sys.executable, "-m", "pipeline.pipeline", "local-run", "--help"],
            capture_output=True, text=True, cwd=REPOSITORY, timeout=120,
        ).stdout.split()
    )  # fmt: skip
    for option in ("--runner", "--output-root", "--verbose", "--resume"):
        described = re.search(rf"{option}(?: \S+)? (.*?)(?= --|$)", help_text).group(1)
        assert len(described.split()) >= 5, (option, described)
    from pipeline import make
    from pipeline.parameters import LOCAL_RUN_SOURCE

    assert re.search(rf'--source STRING .*?\(default: "{LOCAL_RUN_SOURCE}"\)', help_text)
    (demo,) = make.commands_of("local-run", make.Values({}, environment={}))
    assert "--source" not in demo.arguments  # make local-run's source is local-run's own default


def test_progress_says_nothing_of_work_too_short_to_need_it(caplog):
    """A person sees progress of long work (interim lines, then the end), not of a sub-second evaluation."""
    from components.common.progress import Progress

    now = [0.0]
    logger = logging.getLogger("progress-test")
    caplog.set_level(logging.INFO, logger="progress-test")
    quick = Progress("quick", 10, logger=logger, clock=lambda: now[0], quiet_below_seconds=2.0)
    for _ in range(10):
        now[0] += 0.01
        quick.advance()
    assert caplog.messages == []
    slow = Progress("slow", 10, logger=logger, interval_seconds=5.0, clock=lambda: now[0], quiet_below_seconds=2.0)
    for _ in range(10):
        now[0] += 1.0
        slow.advance()
    assert [message.split(":")[0] for message in caplog.messages] == ["slow", "slow"]  # at 5 s and at the end
    assert caplog.messages[-1].startswith("slow: 10/10 items (100%)")


def test_a_publisher_refuses_a_uri_it_would_take_for_a_folder(tmp_path):
    """What a config lets through as a download (http://) is no place to publish: not a folder named "http:"."""
    from components.common import storage

    with pytest.raises(filesystem.StorageError, match=r"^http://host/models: not a folder, gs:// or s3:// location"):
        storage.publisher_for("http://host/models")
    assert storage.publisher_for(str(tmp_path)).root == str(tmp_path)


def _parsers():
    """Every command-line parser a user reaches: a stage's (its config's fields), the pipeline commands' (and their
    subcommands'), TensorBoard's and the serving request's."""
    from components.common.config import build_parser
    from components.train.config import TrainConfig
    from pipeline import commands
    from pipeline.pipeline import pipeline_named

    yield "components.train", build_parser(TrainConfig, "test"), [], "--learning-rate", ("0.1", "0.2")
    yield "pipeline.pipeline", commands.build_parser(pipeline_named(None)), ["local-run"], "--epochs", ("2", "3")
    yield "pipeline.pipeline", commands.build_parser(pipeline_named(None)), ["tensorboard"], "--logdir", ("a", "b")


@pytest.mark.parametrize(("program", "parser", "before", "option", "values"), list(_parsers()))
def test_an_option_given_twice_with_two_values_is_refused_naming_both(capsys, program, parser, before, option, values):
    """argparse keeps an option's last value in silence; here `--epochs 2 ... --epochs 3` (a copied command, or a
    make variable and EXTRA) is refused naming the option and both values. The same value twice is no mistake."""
    first, second = values
    for words in ([option, first, option, second], [f"{option}={first}", option, second]):
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args([*before, *words])
        assert stopped.value.code == 2
        assert f"{option} is given twice ('{first}', then '{second}'): give it once" in capsys.readouterr().err
    parser.parse_args([*before, option, first, f"{option}={first}"])  # the same value twice: taken


def test_the_tensorboard_and_serving_request_commands_refuse_an_option_given_twice():
    for module, words in [
        ("components.common.tensorboard", ["--logdir", "a", "--logdir", "b"]),
        ("components.evaluate.serving_request", ["--answer-from", "a", "--answer-from", "b", "x.png"]),
    ]:
        ran = subprocess.run([sys.executable, "-m", module, *words], capture_output=True, text=True, cwd=REPOSITORY,
                             timeout=120)  # fmt: skip
        assert ran.returncode == 2 and "is given twice ('a', then 'b'): give it once" in ran.stderr, ran.stderr
