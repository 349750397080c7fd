"""One writer per model directory, tied to the folder and its path, not to a file: deleting the lock file, moving
the folder aside and recreating it, or a second path to it never admit a second writer while the first lives, and
the first notices before its next save that its folder is no longer the one at its path."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.common.model_directory import ModelDirectory
from components.common.writer_claim import WRITER_LOCK, WriterClaimError
from tests.builders import tiny_train_config

REPOSITORY = Path(__file__).resolve().parents[1]
HOLDER = """
import sys
from components.common.model_directory import ModelDirectory
directory = ModelDirectory(sys.argv[1])
directory.claim_writer()
print("claimed", flush=True)
for line in sys.stdin:  # "check": is the folder at the path still mine?
    try:
        directory.check_writer()
        print("mine", flush=True)
    except Exception as error:
        print(f"{type(error).__name__}: {error}", flush=True)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding `tmp_path/model` as its writer; `.ask()` has it check its claim."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(model_dir)], cwd=REPOSITORY, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "claimed"

    def ask() -> str:
        process.stdin.write("check\n")
        process.stdin.flush()
        return process.stdout.readline().strip()

    process.ask = ask
    process.model_dir = model_dir
    yield process
    process.kill()
    process.wait()


def refused_for(path, holder) -> str:
    with pytest.raises(WriterClaimError, match=rf"is being written by pid {holder.pid} on .*one writer at a time") as e:
        ModelDirectory(str(path)).claim_writer()
    return str(e.value)


def test_deleting_the_lock_file_admits_no_second_writer(holder):
    (holder.model_dir / WRITER_LOCK).unlink()
    refused_for(holder.model_dir, holder)
    assert holder.ask() == "mine"


def test_a_folder_moved_aside_and_recreated_admits_no_second_writer_and_its_writer_notices(holder, tmp_path):
    holder.model_dir.rename(tmp_path / "model.old")
    holder.model_dir.mkdir()
    message = refused_for(holder.model_dir, holder)
    assert "moved or replaced" in message
    answer = holder.ask()
    assert answer.startswith("WriterClaimError") and re.search(
        rf"model_dir: {holder.model_dir} was replaced by another folder while this run wrote it \(the folder this "
        rf"run holds is now at {tmp_path / 'model.old'}\); stopping without writing there",
        answer,
    ), answer
    refused_for(tmp_path / "model.old", holder)  # the folder it holds, wherever it is now


def test_a_removed_folder_is_noticed(holder):
    shutil.rmtree(holder.model_dir)
    assert re.search(r"was removed while this run wrote it", holder.ask())


def test_a_second_path_to_the_same_folder_admits_no_second_writer(holder, tmp_path):
    (tmp_path / "link").symlink_to(holder.model_dir)
    refused_for(tmp_path / "link", holder)


def test_the_claim_ends_with_its_process_however_it_ends(holder):
    holder.kill()  # kill -9
    holder.wait()
    directory = ModelDirectory(str(holder.model_dir))
    directory.claim_writer()
    directory.release_writer()
    ModelDirectory(str(holder.model_dir)).claim_writer()  # released: taken again


def test_a_training_run_whose_folder_is_replaced_stops_before_its_next_save(synthetic_data, tmp_path):
    from tests.test_train_workers import LiveProcess

    model_dir = tmp_path / "model"
    config = tiny_train_config(
        synthetic_data, model_dir, train_steps=100_000, checkpoint_every_steps=5, log_every_steps=5
    )
    live = LiveProcess(config)
    live.wait_for(r"saved checkpoint .*ckpt-5")
    model_dir.rename(tmp_path / "model.old")
    model_dir.mkdir()
    code, output = live.finish(timeout=120)
    assert code == 2, output[-3000:]
    assert re.search(rf"ERROR .*model_dir: {model_dir} was replaced by another folder", output), output[-3000:]
    assert list(model_dir.iterdir()) == []  # nothing written into the new folder
    saved = sorted(int(p.name[5:-6]) for p in (tmp_path / "model.old").glob("ckpt-*.index"))
    assert saved and max(saved) < 100_000
