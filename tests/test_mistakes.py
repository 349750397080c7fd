"""A person's common mistakes on the command line and with make: each one line, exit 2, in seconds, saying what
would be right; none runs the demo (or anything else) instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import commands
from pipeline.training_pipeline import cifar10_pipeline

REPOSITORY = Path(__file__).resolve().parents[1]


def make(*arguments: str, folder: Path = REPOSITORY, makefile: Path | None = None) -> subprocess.CompletedProcess:
    where = ["-f", str(makefile)] if makefile else ["-C", str(REPOSITORY)]
    return subprocess.run(
        ["make", "--no-print-directory", *where, *arguments, f"VENV={sys.prefix}"],
        capture_output=True, text=True, timeout=120, cwd=folder,
    )  # fmt: skip


@pytest.mark.parametrize("typo", ["EPOCH=2", "SOURC=/data/cifar", "TRAIN_OPTION={}"])
def test_a_make_variable_the_makefile_does_not_know_is_refused_naming_it(typo):
    ran = make("-n", "local-run", typo)
    assert ran.returncode == 2 and ran.stdout == ""
    (line,) = [line for line in ran.stderr.splitlines() if line.strip()]
    assert f"{typo.split('=')[0]}: not a variable of this Makefile" in line


def test_settings_for_the_programs_pass_through_make():
    ran = make("-n", "run", "KFP_HOST=http://127.0.0.1:1", "KF_PIPELINES_SA_TOKEN_PATH=/t", "NAMESPACE=alice", "WAIT=1")
    assert ran.returncode == 0, ran.stderr
    assert "--namespace alice" in ran.stdout and "--wait" in ran.stdout


def test_the_makefile_works_from_any_folder(tmp_path):
    ran = make("-n", "local-run", folder=tmp_path, makefile=REPOSITORY / "Makefile")
    assert ran.returncode == 0, ran.stderr
    assert "python -m pipeline.pipeline local-run --runner subprocess --output-root outputs" in ran.stdout
    tested = make("-n", "test", folder=tmp_path, makefile=REPOSITORY / "Makefile")
    assert f"cd {REPOSITORY}/ && " in tested.stdout


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--epoch", "2"], "unrecognized arguments: --epoch 2 (did you mean --epochs?)"),
        (["--trian-steps", "3"], "(did you mean --train-steps?)"),
        (
            ["--train-options", '{"ema_decay": 0.999,}'],
            "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 21)",
        ),
        (["--train-options", "{\n  'a': 1}"], "at line 2, column 3"),
    ],
)
def test_option_mistakes_are_one_line_with_the_nearest_name_or_the_position(capsys, arguments, expected):
    with pytest.raises(SystemExit) as ended:
        commands.main(cifar10_pipeline, ["local-run", *arguments])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and expected in error, error


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["clean-runs", "--keep", "-1"], "argument --keep: '-1' is not a number of runs (0 or more)"),
        (["tensorboard", "--logdir", "outputs", "--port", "70000"], "'70000' is not a port (1 to 65535)"),
        (
            ["schedule", "--host", "http://127.0.0.1:1", "--cron", "0 0 3 * * *", "--max-concurrency", "0"],
            "'0' is not a number of runs from 1 to 10",
        ),
        (
            ["run", "--host", "http://127.0.0.1:1", "--wait", "--poll-seconds", "0"],
            "'0' is not a number of seconds (more than 0)",
        ),
        (
            ["run", "--host", "http://127.0.0.1:1", "--wait", "--wait-timeout", "nan"],
            "'nan' is not a number of seconds",
        ),
    ],
)
def test_a_command_option_out_of_its_range_is_one_line_before_anything_runs(capsys, arguments, expected):
    with pytest.raises(SystemExit) as ended:
        commands.main(cifar10_pipeline, arguments)
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and expected in error, error


@pytest.mark.parametrize("length", [["--epochs", "-1"], ["--epochs", "0"], ["--train-steps", "-1"]])
def test_a_length_that_is_not_one_is_refused_before_anything_runs(capsys, tmp_path, length):
    assert commands.main(cifar10_pipeline, ["local-run", "--output-root", str(tmp_path / "out"), *length]) == 2
    assert "is not a length; give a positive number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_json_option_names_a_missing_file_as_missing_and_yaml_mistakes_by_line_and_column(tmp_path, capsys):
    from pipeline.sweep_pipeline import cifar10_sweep

    def refusal(space: str) -> str:
        with pytest.raises(SystemExit) as ended:
            commands.main(cifar10_sweep, ["local-run", "--output-root", str(tmp_path / "out"), "--space", space])
        assert ended.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        return line

    assert "spce.yaml: no such file (give a JSON or YAML file, or inline JSON starting with { or [)" in refusal(
        str(tmp_path / "spce.yaml")
    )
    broken = tmp_path / "space.yaml"
    broken.write_text("learning_rate: {low: 0.01, high: 0.3\ndepth: {low: 8, high: 20}\n")
    assert f"{broken}: not a valid JSON or YAML document: not valid JSON or YAML (" in refusal(str(broken))
    assert "at line 2, column" in refusal(str(broken))
    deep = tmp_path / "deep.yaml"
    deep.write_text("a:\n" + "".join("  " * depth + "- \n" for depth in range(1, 200)))
    assert "nested more than the 32 levels" in refusal(str(deep))
    for nothing in ("", "# only a comment\n", "null\n"):  # would be taken for no --space: the default space's sweep
        empty = tmp_path / "empty.yaml"
        empty.write_text(nothing)
        assert f"{empty}: holds no value (it is empty, only comments, or null)" in refusal(str(empty))
    assert not (tmp_path / "out").exists()


def test_tensorboard_on_a_port_in_use_or_a_folder_that_cannot_be_is_one_line_exit_2(capsys, tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = commands.main(cifar10_pipeline, ["tensorboard", "--logdir", str(tmp_path), "--port", str(port)])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"port {port} is in use (another TensorBoard?); choose another" in line
    missing = tmp_path / "no-such-folder" / "model"
    assert commands.main(cifar10_pipeline, ["tensorboard", "--logdir", str(missing)]) == 2
    assert f"{missing}: no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["/proc/cifar10-pipeline-outputs", "a-file"])
def test_an_output_folder_that_cannot_be_is_one_line_before_anything_runs(capsys, tmp_path, output):
    if output == "a-file":
        (tmp_path / output).write_text("not a folder")
        output = str(tmp_path / output)
    assert commands.main(cifar10_pipeline, ["local-run", "--output-root", output]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"OUTPUT {output} " in line and "give a folder this user can write" in line


def test_nothing_to_resume_leaves_no_output_folder_behind(capsys, tmp_path):
    output = tmp_path / "outputs"
    assert commands.main(cifar10_pipeline, ["local-run", "--output-root", str(output), "--resume", "last"]) == 2
    assert "--resume last: no interrupted run in" in capsys.readouterr().err
    assert not output.exists()


def test_more_training_processes_than_the_machine_holds_are_refused_before_anything_runs(tmp_path, capsys):
    """Each training process needs TensorFlow's own half GB before any data: WORKERS=4096 (which a cluster job may
    have) as local processes, or a sweep's trials at once with their workers, would have the kernel swap and kill
    them, the machine with them. One line naming the setting, what it needs, what is available and what fits, exit
    2, nothing made; every path that starts them checks it (a local run, the train stage's local launcher, the
    sweep)."""
    from components.train.launch_local import PROCESS_MEMORY_FLOOR, available_memory, processes_problem
    from pipeline.sweep_pipeline import cifar10_sweep

    available = available_memory()
    assert available is not None and available > 0  # /proc/meminfo, and a cgroup's limit where there is one
    assert processes_problem(2, "workers", available=8 * PROCESS_MEMORY_FLOOR) is None
    line = processes_problem(10, "workers", available=8 * PROCESS_MEMORY_FLOOR + 1)
    assert line == (
        "workers: 10 training processes on this machine need at least 5.0 GB (0.5 GB each, TensorFlow's own before "
        "any data), and it has 4.0 GB available: give at most 8"
    )
    too_many = str(2 * int(available // PROCESS_MEMORY_FLOOR) + 2)  # twice: the machine's memory comes and goes
    output = tmp_path / "out"
    local_run = ["local-run", "--output-root", str(output), "--workers", too_many, "--batch-size", too_many]
    assert commands.main(cifar10_pipeline, local_run) == 2
    assert f"workers: {too_many} training processes on this machine need at least" in capsys.readouterr().err
    sweep = ["local-run", "--output-root", str(output), "--parallelism", "2", "--trial-workers", too_many]
    assert commands.main(cifar10_sweep, sweep) == 2
    assert f"parallelism 2 x trial_workers {too_many}: " in capsys.readouterr().err
    assert not output.exists()
    for program, options in [
        ("components.train", ["--data", str(tmp_path), "--model-dir", str(output), "--launcher", "local",
                              "--workers", too_many, "--batch-size", too_many]),
        ("components.sweep", ["--data", str(tmp_path), "--sweep-dir", str(output), "--launcher", "local",
                              "--space", '{"depth": {"choices": [8, 14]}}', "--workers", too_many,
                              "--parallelism", "2"]),
    ]:  # fmt: skip
        ran = subprocess.run([sys.executable, "-m", program, *options], capture_output=True, text=True, timeout=120)
        errors = [line for line in ran.stderr.splitlines() if " ERROR " in line]
        assert ran.returncode == 2 and len(errors) == 1 and "training processes on this machine" in errors[0], (
            ran.stderr
        )
        assert not output.exists()


def test_a_stage_without_a_required_option_names_the_option(tmp_path):
    """Not Python's "__init__() missing 1 required positional argument": the option, as the person types it."""
    ran = subprocess.run(
        [sys.executable, "-m", "components.predict", "--images", str(tmp_path)], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert ran.returncode == 2
    assert "model, output: required, and not given (--model, --output on the command line)" in ran.stderr
    assert "__init__" not in ran.stderr


def test_predict_with_a_model_folder_that_does_not_exist_says_so_and_writes_nothing(tmp_path):
    """`make predict` before anything was promoted: the folder is missing, not "not a SavedModel"."""
    output = tmp_path / "predictions.jsonl"
    ran = subprocess.run(
        [sys.executable, "-m", "components.predict", "--model", str(tmp_path / "models"), "--images", str(tmp_path),
         "--output", str(output)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 2
    assert f"{tmp_path / 'models'}: no such folder; give a promotion root (make local-run promotes" in ran.stderr
    assert not output.exists()
