"""One writer per remote model directory across machines: the lease in the object store, on gs:// and s3://.

Two `ModelDirectory` objects with separate local mirrors stand for two machines."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import storage, stores
from components.common import writer_claim as writer_lease
from components.common.model_directory import ModelDirectory
from components.common.writer_claim import WriterClaimError

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def short_leases(monkeypatch):
    monkeypatch.setattr(writer_lease, "LEASE_SECONDS", 4.0)
    monkeypatch.setattr(writer_lease, "RENEW_SECONDS", 1.0)
    monkeypatch.setattr(writer_lease, "POLL_SECONDS", 0.2)


def machine(model_dir: str, tmp_path, name: str) -> ModelDirectory:
    return ModelDirectory(model_dir, cache_dir=tmp_path / name)


def test_a_second_writer_on_another_machine_fails_naming_the_holder(coordinated_store, tmp_path):
    model_dir = f"{coordinated_store}/models/run"
    first = machine(model_dir, tmp_path, "a")
    first.claim_writer()
    try:
        second = machine(model_dir, tmp_path, "b")
        started = time.monotonic()
        with pytest.raises(WriterClaimError, match=r"is being written by pid \d+ on .* since .*one writer at a time"):
            second.claim_writer()
        assert time.monotonic() - started < 4.0  # the holder's renewal showed it alive before its lease ran out
    finally:
        first.release_writer()
    assert storage.publisher_for(model_dir).read_document(writer_lease.WRITER_LEASE)[0] is None  # released: removed
    third = machine(model_dir, tmp_path, "c")
    third.claim_writer()  # a released lease is free at once
    third.release_writer()


def test_the_lease_of_a_killed_writer_is_taken_over_after_it_runs_out(coordinated_store, tmp_path):
    model_dir = f"{coordinated_store}/models/run"
    killed = {"holder": "pid 1 on gone-host since then", "token": "dead", "renewed_at": time.time()}
    started = time.monotonic()  # the lease runs out counted from its last renewal, this moment
    storage.publisher_for(model_dir).swap_document(
        writer_lease.WRITER_LEASE, json.dumps(killed).encode(), stores.ABSENT
    )
    newcomer = machine(model_dir, tmp_path, "a")
    newcomer.claim_writer()
    try:
        assert 3.0 < time.monotonic() - started < 15.0
        lease = json.loads(storage.publisher_for(model_dir).read_document(writer_lease.WRITER_LEASE)[0])
        assert lease["token"] != "dead" and lease["holder"].startswith("pid ")
    finally:
        newcomer.release_writer()


def test_a_writer_whose_lease_was_taken_stops_at_its_next_push(coordinated_store, tmp_path):
    model_dir = f"{coordinated_store}/models/run"
    writer = machine(model_dir, tmp_path, "a")
    writer.claim_writer()
    try:
        intruder = {"holder": "pid 2 on other-host since now", "token": "other", "renewed_at": time.time()}
        publisher = storage.publisher_for(model_dir)
        _content, version = publisher.read_document(writer_lease.WRITER_LEASE)
        publisher.swap_document(writer_lease.WRITER_LEASE, json.dumps(intruder).encode(), version)
        time.sleep(2.5)  # the writer's next renewal finds the lease changed
        (writer.local / "ckpt-1.index").write_bytes(b"x")
        with pytest.raises(WriterClaimError, match=r"another writer took over; this one stops"):
            writer.push()
    finally:
        writer.release_writer()


def test_publish_answers_the_version_it_wrote_and_the_lease_never_reads_its_own_back(
    coordinated_store, tmp_path, monkeypatch
):
    """The lease's next compare-and-swap uses the version the store answered to its own write: read back instead,
    another writer's version written in between would be taken for its own."""
    store = storage.publisher_for(f"{coordinated_store}/versions")
    written = store.publish("record.json", b"one", expected_version=stores.ABSENT)
    assert written == store.read_versioned("record.json")[1]
    replaced = store.publish("record.json", b"two", expected_version=written)
    assert replaced != written and replaced == store.read_versioned("record.json")[1]
    assert store.publish("record.json", b"two") == replaced  # the same bytes again: nothing written, same version

    def no_read_back(self, name):
        raise AssertionError(f"the writer lease read {name}'s version back instead of using its write's answer")

    monkeypatch.setattr(type(store), "version", no_read_back)
    model_dir = f"{coordinated_store}/models/run"
    holder = machine(model_dir, tmp_path, "a")
    holder.claim_writer()
    try:
        time.sleep(2.5)  # two renewals, each a compare-and-swap on the version of the one before
        content = json.loads(storage.publisher_for(model_dir).read_document(writer_lease.WRITER_LEASE)[0])
        assert time.time() - content["renewed_at"] < 2.0, "the renewals went through"
        holder.check_writer()  # the lease is still its own
    finally:
        holder.release_writer()


def test_a_local_mirror_holds_only_what_the_store_holds_once_pulled(object_store, tmp_path):
    """A user who deleted a model directory's objects to start over, training again on the same machine: the mirror's
    old checkpoints are not resumed from (the store is the truth)."""
    model_dir = f"{object_store}/models/again"
    first = machine(model_dir, tmp_path, "same-machine")
    first.claim_writer()
    try:
        for name in ("ckpt-20.index", "ckpt-20.data-00000-of-00001", "checkpoint"):
            (first.local / name).write_bytes(b"x")
        first.push()
    finally:
        first.release_writer()
    publisher = storage.publisher_for(model_dir)
    for name in publisher.list():
        publisher.withdraw(name)
    again = machine(model_dir, tmp_path, "same-machine")
    again.pull()
    assert sorted(path.name for path in again.local.iterdir() if not path.name.startswith(".")) == []


FROZEN_WRITER = """
import os, signal, sys
from components.common import storage, writer_claim
from components.common.model_directory import ModelDirectory

writer_claim.LEASE_SECONDS, writer_claim.RENEW_SECONDS, writer_claim.POLL_SECONDS = 4.0, 1.0, 0.2
directory = ModelDirectory(sys.argv[1], cache_dir=sys.argv[2])
directory.claim_writer()
(directory.local / "ckpt-1.data-00000-of-00001").write_bytes(b"the old writer's" * 1000)
store = type(storage.publisher_for(sys.argv[1]))
upload = store.publish

def frozen_upload(self, name, data, expected_version=None):
    if name.endswith(".data-00000-of-00001"):
        print("uploading", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen mid-upload: Ctrl-Z, a debugger, a frozen cgroup
    return upload(self, name, data, expected_version)

store.publish = frozen_upload
directory.push()
"""


def test_a_writer_frozen_during_an_upload_past_its_lease_never_lands_over_the_newcomer(coordinated_store, tmp_path):
    model_dir = f"{coordinated_store}/models/run"
    name = "ckpt-1.data-00000-of-00001"
    frozen = subprocess.Popen(
        [sys.executable, "-c", FROZEN_WRITER, model_dir, str(tmp_path / "old")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY,
    )  # fmt: skip
    try:
        assert frozen.stdout.readline() == "uploading\n"
        newcomer = machine(model_dir, tmp_path, "new")
        newcomer.claim_writer()  # the frozen holder renews nothing: taken over after the lease, watched
        (newcomer.local / name).write_bytes(b"the newcomer's")
        newcomer.push()
        frozen.send_signal(signal.SIGCONT)  # the old writer's upload goes on
        _output, errors = frozen.communicate(timeout=60)
        assert frozen.returncode != 0
        assert re.search(r"another writer took over|could not renew its lease for \d+ s", errors), errors
        publisher = storage.publisher_for(model_dir)
        assert publisher.read(name) == b"the newcomer's"
        assert publisher.list(".staging/") == []  # the old writer's upload withdrawn
        newcomer.release_writer()
    finally:
        frozen.kill()
        frozen.wait()
