"""A full disk is an operator's problem to fix and retry: each stage ends with one line naming where, removes what it
had half-written, and exits 144 (retried). The disk is a real small tmpfs, mounted in a mount namespace of the
command's own (`unshare`), so that the real TensorFlow and Python writers hit a real ENOSPC."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from components.common import exit_codes
from components.common.config import config_to_dict
from components.train import loop
from tests.builders import REPOSITORY, tiny_train_config


def _namespaces_available() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(
    not _namespaces_available(), reason="needs unshare -rm (unprivileged user and mount namespaces) for a small disk"
)


def run_on_a_small_disk(tmp_path: Path, disk: Path, size: str, command: list[str]) -> tuple[int, str, list[str]]:
    """Run `command` with a `size` tmpfs mounted at `disk` (seen by this command only); (exit code, stderr, the
    paths left on the disk afterwards)."""
    disk.mkdir(parents=True, exist_ok=True)
    listing = tmp_path / "left-on-disk.txt"
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(disk))} || exit 99\n"
        f"{shlex.join(command)}\ncode=$?\n"
        f"(cd {shlex.quote(str(disk))} && find . -mindepth 1 | sort) > {shlex.quote(str(listing))}\nexit $code\n"
    )
    completed = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=REPOSITORY, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode != 99, completed.stderr
    left = [line.removeprefix("./") for line in listing.read_text().splitlines()]
    return completed.returncode, completed.stderr, left


def assert_one_line_out_of_space(code: int, stderr: str, disk: Path) -> str:
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert code == exit_codes.NO_SPACE, stderr[-3000:]
    assert len(errors) == 1, stderr[-3000:]
    assert f"out of disk space writing {disk}" in errors[0] and "(exit 144)" in errors[0], errors[0]
    assert "Traceback" not in stderr
    return errors[0]


def test_prepare_data_on_a_full_disk_leaves_no_shard(tmp_path):
    disk = tmp_path / "disk"
    command = [sys.executable, "-m", "components.prepare_data", "--source", "synthetic", "--output",
               str(disk / "dataset"), "--synthetic-train-per-class", "300", "--examples-per-shard", "200"]  # fmt: skip
    code, stderr, left = run_on_a_small_disk(tmp_path, disk, "1m", command)
    assert_one_line_out_of_space(code, stderr, disk)
    assert [path for path in left if path != "dataset"] == [], left


def test_training_on_a_full_disk_keeps_no_partial_checkpoint(synthetic_data, tmp_path):
    disk = tmp_path / "disk"
    config = tiny_train_config(synthetic_data, disk / "model", train_steps=6, checkpoint_every_steps=2)
    command = [sys.executable, "-m", "components.train", "--config", json.dumps(config_to_dict(config))]
    code, stderr, left = run_on_a_small_disk(tmp_path, disk, "150k", command)
    assert_one_line_out_of_space(code, stderr, disk)
    assert "model/config.json" in left  # what was written whole before the disk filled up stays
    assert not [path for path in left if "_temp" in path], left  # TensorFlow's half-written save
    saved = {path.split(".")[0] for path in left if Path(path).name.startswith("ckpt-")}
    for checkpoint in saved:  # every checkpoint left is whole: its index and its data
        assert {f"{checkpoint}.index", f"{checkpoint}.data-00000-of-00001"} <= set(left), left


def test_a_promotion_on_a_full_disk_leaves_the_root_as_it_was(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=2))
    disk = tmp_path / "disk"
    command = [sys.executable, "-m", "components.evaluate", "--data", synthetic_data, "--model-dir", str(model_dir),
               "--promote-to", str(disk / "models")]  # fmt: skip
    code, stderr, left = run_on_a_small_disk(tmp_path, disk, "64k", command)
    assert_one_line_out_of_space(code, stderr, disk)
    assert [path for path in left if not Path(path).name.startswith(".")] in ([], ["models"]), left
