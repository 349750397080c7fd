"""One read of the source: what is hashed is what is converted. An archive is hashed as it is copied into a private
scratch file that every later read takes its bytes from; a folder's files are checked, as they are read to be
decoded, against the digests the folder's digest was made of. A source that changes while it is read is refused in
one line and nothing is published; one replaced after its read cannot reach the dataset."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from components.prepare_data import prepare, safe_io
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
from components.prepare_data.safe_io import SourceError
from tests.builders import tar_folder, write_class_folders


def published(folder) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*")
            if path.is_file() and not path.name.startswith(".")}  # fmt: skip


@pytest.fixture
def two_versions(tmp_path):
    """Two archives of the same layout and other pixels."""
    archives = []
    for seed in (1, 2):
        folder = tmp_path / f"images-{seed}"
        write_class_folders(folder, {"train": 8, "test": 3}, seed=seed)
        archives.append(tar_folder(folder, tmp_path / f"images-{seed}.tar.gz"))
    return archives


def test_an_archive_replaced_after_its_read_cannot_reach_the_dataset(tmp_path, two_versions, monkeypatch):
    first, second = two_versions
    source = tmp_path / "source.tar.gz"
    shutil.copy(first, source)
    real_plan = prepare.plan_dataset

    def plan_after_a_replacement(resolved, config):
        shutil.copy(second, source)  # replaced right after the read that hashed it
        return real_plan(resolved, config)

    monkeypatch.setattr(prepare, "plan_dataset", plan_after_a_replacement)
    result = prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=str(source), examples_per_shard=4))
    monkeypatch.setattr(prepare, "plan_dataset", real_plan)
    assert result.manifest.source["sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()
    prepare_data(PrepareDataConfig(output=str(tmp_path / "first"), source=str(first), examples_per_shard=4))
    shards, first_shards = published(tmp_path / "out"), published(tmp_path / "first")
    shards.pop("manifest.json"), first_shards.pop("manifest.json")  # they name their sources' paths
    assert shards == first_shards  # the first version's pixels and statistics, whole


def test_an_archive_that_changes_while_it_is_read_is_refused_in_one_line(tmp_path, two_versions, monkeypatch):
    source = tmp_path / "source.tar.gz"
    shutil.copy(two_versions[0], source)
    monkeypatch.setattr(safe_io, "_CHUNK_BYTES", 256)
    real = safe_io.HashingReader.readinto
    calls = []

    def readinto(self, buffer):
        calls.append(1)
        if len(calls) == 2:
            with open(source, "ab") as appended:  # written to while read
                appended.write(b"\0" * 512)
        return real(self, buffer)

    monkeypatch.setattr(safe_io.HashingReader, "readinto", readinto)
    with pytest.raises(SourceError, match=r"source\.tar\.gz: the file changed while it was read; nothing was"):
        prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=str(source)))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.tfrecord"))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_folder_image_rewritten_after_the_folder_was_hashed_is_refused_and_nothing_published(
    tmp_path, monkeypatch, workers
):
    folder = tmp_path / "images"
    write_class_folders(folder, {"train": 8, "test": 3}, seed=3)
    victim = sorted(folder.rglob("*.png"))[5]
    real_plan = prepare.plan_dataset

    def plan_after_a_rewrite(resolved, config):
        victim.write_bytes((folder / "test" / "cat" / "0000.png").read_bytes())  # another image, same name
        return real_plan(resolved, config)

    monkeypatch.setattr(prepare, "plan_dataset", plan_after_a_rewrite)
    config = PrepareDataConfig(output=str(tmp_path / "out"), source=str(folder), prepare_workers=workers)
    with pytest.raises((SourceError, ValueError), match=r"changed"):
        prepare_data(config)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert list((tmp_path / "out").rglob("*.tfrecord")) == []
