"""Every outcome has its exit code and one line: a folder the stage may not write (read-only, permission denied)
is found before the heavy set-up; a name that is not UTF-8 is shown escaped; a TF_CONFIG left in the shell is said,
and refused when it would make a local run join another machine's cluster."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common.cli import report_error

REPOSITORY = Path(__file__).resolve().parents[1]


def run_under_a_read_only_folder(folder: Path, *command: str) -> subprocess.CompletedProcess:
    """`command` with `folder` mounted read-only, in a user namespace of its own (root or not)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available here: {probe.stderr.decode()[:200]}")
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o ro,size=1m tmpfs "{folder}" && exec "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *command],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "stage",
    [
        ["components.prepare_data", "--source", "synthetic", "--output", "{folder}/dataset"],
        ["components.train", "--data", "{folder}/none", "--model-dir", "{folder}/model", "--workers", "1"],
    ],
    ids=["prepare_data output", "train model_dir"],
)
def test_a_read_only_output_ends_the_stage_with_exit_2_naming_it_before_any_set_up(tmp_path, stage):
    folder = tmp_path / "read-only"
    started = time.monotonic()
    arguments = [part.replace("{folder}", str(folder)) for part in stage]
    completed = run_under_a_read_only_folder(folder, sys.executable, "-m", *arguments)
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(errors) == 1 and str(folder) in errors[0] and "read-only" in errors[0], completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr and time.monotonic() - started < 20  # before TensorFlow and the data


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/models/run"), "cannot use /models/run: permission"),
        (OSError(errno.EROFS, "Read-only file system", "/data/out"), "cannot use /data/out: read-only"),
        (OSError(errno.EPERM, "Operation not permitted", "/x"), "cannot use /x: operation not permitted"),
    ],
)
def test_a_denied_path_raised_anywhere_is_a_bad_input_of_one_line(error, expected, caplog):
    wrapped = RuntimeError("while writing the checkpoint")
    wrapped.__cause__ = error  # as another library re-raises it
    assert report_error(wrapped, "stage", (ValueError,)) == 2
    assert expected in caplog.text


def test_a_name_that_is_not_utf8_is_shown_escaped_and_refused_in_one_line(tmp_path, caplog):
    name = os.fsdecode(b"caf\xe9")  # a Latin-1 folder name, as Python holds it (a surrogate)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        assert report_error(error, "stage", (ValueError,)) == 2
    assert "the name caf\\udce9 is not UTF-8" in caplog.text


def test_a_class_folder_whose_name_is_not_utf8_is_refused_by_prepare_data(tmp_path):
    from PIL import Image

    source = os.fsencode(tmp_path / "images")
    for label in (b"cat", b"caf\xe9"):
        for split in (b"train", b"test"):
            folder = os.path.join(source, split, label)
            os.makedirs(folder)
            for index in range(4):
                Image.new("RGB", (32, 32)).save(os.fsdecode(os.path.join(folder, b"%d.png" % index)))
    completed = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--source", os.fsdecode(source),
         "--output", str(tmp_path / "out")],
        cwd=REPOSITORY, capture_output=True, timeout=120,
    )  # fmt: skip
    stderr = completed.stderr.decode("utf-8")  # the output itself is UTF-8: the name is escaped in it
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2 and len(errors) == 1 and "caf\\udce9" in errors[0], stderr[-2000:]


OTHER_CLUSTER = '{"cluster": {"worker": ["w0.other-cluster.invalid:2222", "w1.other-cluster.invalid:2222"]}, ' \
    '"task": {"type": "worker", "index": 0}}'  # fmt: skip
LOCAL_CLUSTER = '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 0}}'


def test_a_tf_config_naming_another_machine_is_refused_for_a_local_run(monkeypatch, caplog, tmp_path):
    from components.train.config import TrainConfig
    from components.train.launcher import choose_launcher

    caplog.set_level("INFO")
    monkeypatch.setenv("TF_CONFIG", OTHER_CLUSTER)
    config = TrainConfig(data=str(tmp_path), model_dir=str(tmp_path / "model"), workers=2)
    with pytest.raises(ValueError, match=r"w0\.other-cluster\.invalid.*--launcher worker \(join it\)"):
        choose_launcher(config)
    assert "TF_CONFIG from the environment" in caplog.text  # said, before it is refused
    import dataclasses

    assert choose_launcher(dataclasses.replace(config, launcher="worker")) == "worker"  # asked for: joined
    monkeypatch.setenv("TF_CONFIG", LOCAL_CLUSTER)
    caplog.clear()
    assert choose_launcher(config) == "worker"  # the local launcher's own workers: this machine only
    assert "127.0.0.1" in caplog.text
