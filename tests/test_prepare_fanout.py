"""prepare_data fanned out: `--prepare-workers N` splits the shards among N workers (local processes here, a pipeline's
ParallelFor pods on a cluster), each publishing its shards and their partial statistics; one merge publishes the
manifest and statistics. The dataset is the same bytes whatever N, a killed worker is retried and resumes, and what
a worker left unfinished is never merged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from components.prepare_data import statistics as data_statistics
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
from tests.builders import tar_folder, write_class_folders

REPOSITORY = Path(__file__).resolve().parents[1]


def published(folder: Path) -> dict[str, bytes]:
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and not path.name.startswith(".")
    }


@pytest.fixture(scope="module")
def folder_source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    write_class_folders(root / "images", {"train": 60, "test": 20}, seed=5)
    return tar_folder(root / "images", root / "images.tar.gz")


def random_split(count: int, seed: int, side: int = 32):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, size=count)
    sizes = np.tile([side, side], (count, 1))
    colors = np.array(["RGB", "grayscale", "RGB", "palette"] * (count // 4), dtype=object)
    return images, labels, [f"image-{index}" for index in range(count)], sizes, colors


@pytest.mark.parametrize("side", [32, 40])
def test_a_splits_statistics_merged_from_its_parts_equal_those_of_the_whole(side):
    images, labels, ids, sizes, colors = random_split(500, seed=side, side=side)  # the look measures all 500
    whole = data_statistics.SplitStatistics(4)
    whole.add(images, labels, ids, sizes, colors)
    merged = data_statistics.SplitStatistics(4)
    for part in (slice(0, 100), slice(100, 356), slice(356, 500)):
        shard = data_statistics.SplitStatistics(4)
        shard.add(images[part], labels[part], ids[part], sizes[part], colors[part])
        merged.merge(data_statistics.SplitStatistics.from_bytes(shard.to_bytes(), "a shard"))
    assert merged.ids == whole.ids
    for name in ("count", "class_counts", "channel_histogram", "saturation_histogram", "detail_histogram"):
        assert np.array_equal(getattr(merged, name), getattr(whole, name)), name
    assert merged.sizes == whole.sizes and merged.conversions == whole.conversions
    assert np.array_equal(np.concatenate(merged.digests), np.concatenate(whole.digests))
    assert np.array_equal(merged.descriptors(), whole.descriptors())
    assert merged.look_count == whole.look_count == 500
    exact = ["channel_sum", "channel_square_sum", "class_pixel_sum"]  # sums of integers (the images at 32x32: uint8)
    for name in exact:
        assert np.array_equal(getattr(merged, name), getattr(whole, name)), name
    # Sums of floats, added in another order, agree to rounding (a prepare merges every split in shard order, with
    # one worker or many: the same bits, test_two_workers_publish_what_one_process_does)
    for name in ("per_image_sums", "class_per_image_sums"):
        assert np.allclose(getattr(merged, name), getattr(whole, name), rtol=1e-6), name
    assert merged.summary()["channel_mean"] == whole.summary()["channel_mean"]
    assert merged.summary()["channel_std"] == whole.summary()["channel_std"]


def test_partial_statistics_that_are_not_are_refused_in_one_line():
    images, labels, ids, sizes, colors = random_split(8, seed=1)
    shard = data_statistics.SplitStatistics(4)
    shard.add(images, labels, ids, sizes, colors)
    content = shard.to_bytes()
    with pytest.raises(ValueError, match=r"^parts/x\.npz: not a prepare worker's partial statistics"):
        data_statistics.SplitStatistics.from_bytes(content[: len(content) // 2], "parts/x.npz")
    with pytest.raises(ValueError, match=r"^parts/x\.npz: not a prepare worker's partial statistics"):
        data_statistics.SplitStatistics.from_bytes(b"<html>", "parts/x.npz")


@pytest.mark.parametrize("leakage", ["keep", "drop_from_eval"])
def test_two_workers_publish_what_one_process_does(tmp_path, folder_source, leakage):
    config = {"source": str(folder_source), "examples_per_shard": 25, "leakage": leakage}
    one = prepare_data(PrepareDataConfig(output=str(tmp_path / "one"), **config))
    two = prepare_data(PrepareDataConfig(output=str(tmp_path / "two"), prepare_workers=2, **config))
    assert one.manifest_sha256 == two.manifest_sha256
    first, second = published(tmp_path / "one"), published(tmp_path / "two")
    assert sorted(first) == sorted(second)
    assert [name for name in first if first[name] != second[name]] == []
    assert not (tmp_path / "two" / ".parts").exists(), "the workers' partial statistics were left behind"


def test_workers_run_as_pods_and_a_merge_from_their_own_folders_publish_the_same(tmp_path, folder_source):
    """A pipeline's ParallelFor: each worker publishes into its own artifact; the merge copies their shards in."""
    config = {"source": str(folder_source), "examples_per_shard": 30, "prepare_workers": 3}
    for index in range(3):
        assert (
            prepare_data(PrepareDataConfig(output=str(tmp_path / f"part-{index}"), part=str(index), **config)) is None
        )
    assert not (tmp_path / "part-0" / "manifest.json").exists()
    parts = tuple(str(tmp_path / f"part-{index}") for index in range(3))
    with pytest.raises(ValueError, match=r"no worker published this shard whole"):
        prepare_data(PrepareDataConfig(output=str(tmp_path / "short"), part="merge", parts_from=parts[:2], **config))
    assert not (tmp_path / "short" / "manifest.json").exists()
    assert [path for path in (tmp_path / "short").rglob("*.tfrecord")] == [], "copied shards were left behind"
    merged = prepare_data(PrepareDataConfig(output=str(tmp_path / "merged"), part="merge", parts_from=parts, **config))
    whole = prepare_data(PrepareDataConfig(output=str(tmp_path / "whole"), source=config["source"],
                                           examples_per_shard=30))  # fmt: skip
    assert merged.manifest_sha256 == whole.manifest_sha256
    assert published(tmp_path / "merged") == published(tmp_path / "whole")


def test_a_record_whose_shard_was_cut_short_is_not_merged(tmp_path, folder_source):
    config = {"source": str(folder_source), "examples_per_shard": 40, "prepare_workers": 2}
    output = tmp_path / "dataset"
    for index in range(2):
        prepare_data(PrepareDataConfig(output=str(output), part=str(index), **config))
    shard = next(output.glob("train/*.tfrecord"))
    shard.write_bytes(shard.read_bytes()[:-10])  # a worker's write cut short, its record already there
    with pytest.raises(ValueError, match=rf"{shard.name}: no worker published this shard whole"):
        prepare_data(PrepareDataConfig(output=str(output), part="merge", **config))
    assert not (output / "manifest.json").exists()
    for index in range(2):  # a retried worker: redoes the cut shard, skips those that landed whole
        prepare_data(PrepareDataConfig(output=str(output), part=str(index), **config))
    assert prepare_data(PrepareDataConfig(output=str(output), part="merge", **config)).manifest.splits["train"]


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_killed_worker_is_started_again_and_the_dataset_is_the_same(tmp_path, folder_source):
    """The workers are killed (SIGKILL, as a node loss or the OOM killer does) once the first shard has landed: each
    is started again, the one that had landed a shard resumes past it, and the dataset is one process's."""
    options = ["--source", str(folder_source), "--examples-per-shard", "5"]
    output = tmp_path / "fanned"
    command = [sys.executable, "-m", "components.prepare_data", *options, "--output", str(output),
               "--prepare-workers", "2"]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPOSITORY, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(output.glob(".parts/*/*.json")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    workers = _children(process.pid)
    assert len(workers) == 2, "the workers ended before a shard landed, or never started"
    for worker in workers:  # frozen where they are, then killed: a worker can end between the two only if it is done
        os.kill(worker, signal.SIGSTOP)
    killed = [worker for worker in workers if _state(worker) not in ("Z", "X", None)]
    for worker in killed:
        os.kill(worker, signal.SIGKILL)
    _out, log = process.communicate(timeout=300)
    assert process.returncode == 0, log[-2000:]
    assert killed and log.count("was killed by signal 9; starting it again (attempt 2 of 3)") == len(killed), log[
        -3000:
    ]
    assert "of its" in log and "shards are already published" in log, log[-3000:]  # the one that landed a shard
    prepare_data(PrepareDataConfig(output=str(tmp_path / "one"), source=str(folder_source), examples_per_shard=5))
    assert published(output) == published(tmp_path / "one")


def test_a_worker_that_refuses_the_source_ends_the_run_in_one_line(tmp_path):
    root = tmp_path / "images"
    write_class_folders(root, {"train": 6, "test": 2}, seed=2)
    (root / "train" / "cat" / "0003.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # a broken image
    command = [sys.executable, "-m", "components.prepare_data", "--source", str(root), "--output",
               str(tmp_path / "out"), "--prepare-workers", "2", "--examples-per-shard", "2"]  # fmt: skip
    ended = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert ended.returncode == 2, ended.stderr[-2000:]
    assert "train/cat/0003.png" in ended.stderr
    assert "Traceback" not in ended.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert list((tmp_path / "out").rglob("*.tfrecord")) == [], "a refused run left shards behind"


def test_part_and_prepare_workers_are_checked_in_one_line():
    with pytest.raises(ValueError, match=r"^part: '2' is not all, merge or a worker's index 0\.\.1$"):
        PrepareDataConfig(output="out", part="2", prepare_workers=2)
    with pytest.raises(ValueError, match=r"^parts_from: given with --part all"):
        PrepareDataConfig(output="out", parts_from=("a",))
    with pytest.raises(ValueError, match=r"prepare_workers"):
        PrepareDataConfig(output="out", prepare_workers=0)


def test_the_merge_takes_no_part_of_another_source_or_setting(tmp_path, folder_source):
    """A part is named by the dataset's key (the source's digest and the settings): another's is never merged."""
    config = {"source": str(folder_source), "examples_per_shard": 40, "prepare_workers": 1}
    prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), part="0", **config))
    with pytest.raises(ValueError, match=r"no worker published this shard whole"):
        prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), part="merge", seed=7, **config))
    assert prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), part="merge", **config)).reused is False


def test_workers_after_tensorflow_ran_in_the_run_finish_and_publish_one_processs_dataset(tmp_path, folder_source):
    """--resize and --leakage drop_from_train: the leak search resizes with TensorFlow before the workers start. The
    workers are fresh interpreters (a fork after TensorFlow ran waits for ever in its first op), so the run ends, and
    publishes what one process does."""
    options = ["--source", str(folder_source), "--examples-per-shard", "20", "--resize", "24",
               "--leakage", "drop_from_train"]  # fmt: skip
    command = [sys.executable, "-m", "components.prepare_data", *options, "--output", str(tmp_path / "two"),
               "--prepare-workers", "2"]  # fmt: skip
    done = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one = [sys.executable, "-m", "components.prepare_data", *options, "--output", str(tmp_path / "one")]
    assert subprocess.run(one, cwd=REPOSITORY, capture_output=True, timeout=600).returncode == 0
    assert published(tmp_path / "two") == published(tmp_path / "one")


def test_a_hung_worker_is_ended_after_its_silence_and_started_again(tmp_path, folder_source):
    """Workers that say nothing more once they have begun (frozen: SIGSTOP, a deadlock) are ended once silent for
    the bound and started again, as dead ones are; the run publishes one process's dataset."""
    import threading

    output = tmp_path / "fanned"
    command = [sys.executable, "-m", "components.prepare_data", "--source", str(folder_source), "--output",
               str(output), "--examples-per-shard", "5", "--prepare-workers", "2"]  # fmt: skip
    environment = {**os.environ, "CIFAR10_PIPELINE_PREPARE_WORKER_SILENCE_SECONDS": "15"}
    process = subprocess.Popen(command, cwd=REPOSITORY, stderr=subprocess.PIPE, text=True, env=environment)
    lines, begun = [], threading.Event()

    def read() -> None:
        for line in process.stderr:
            lines.append(line)
            if "oneDNN" in line or "worker 0 of 2" in line or "worker 1 of 2" in line:
                begun.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert begun.wait(180), "".join(lines)[-3000:]
    frozen = _children(process.pid)
    for worker in frozen:
        os.kill(worker, signal.SIGSTOP)
    process.wait(timeout=400)
    reader.join(timeout=30)
    log = "".join(lines)
    assert process.returncode == 0, log[-3000:]
    assert "said nothing for 15 s (hung?); it was ended; starting it again (attempt 2 of 3)" in log, log[-3000:]
    prepare_data(PrepareDataConfig(output=str(tmp_path / "one"), source=str(folder_source), examples_per_shard=5))
    assert published(output) == published(tmp_path / "one")


def test_a_worker_that_reads_another_source_than_its_run_refuses_it_in_one_line(tmp_path, folder_source, monkeypatch):
    """The run plans from its read of the source; a worker reads it again: when the two differ (the archive was
    replaced in between) the worker refuses in one line, and nothing of it is published."""
    from components.prepare_data import workers

    monkeypatch.setenv(workers.KEY_VARIABLE, "0123456789ab")  # the key of the run's read, unlike this one's
    config = PrepareDataConfig(output=str(tmp_path / "out"), source=str(folder_source), prepare_workers=2, part="0")
    with pytest.raises(ValueError, match=r"the source changed while it was being read .* planned 0123456789ab"):
        prepare_data(config)
    assert list((tmp_path / "out").rglob("*.tfrecord")) == []
