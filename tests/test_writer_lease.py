"""One writer per remote model directory across machines: the lease in the object store, on gs:// and s3://.

Two `ModelDirectory` objects with separate local mirrors stand for two machines."""

from __future__ import annotations

import json
import time

import pytest

from components.common import storage
from components.common import writer_claim as writer_lease
from components.common.model_directory import ModelDirectory
from components.common.writer_claim import WriterClaimError


@pytest.fixture(autouse=True)
def short_leases(monkeypatch):
    monkeypatch.setattr(writer_lease, "LEASE_SECONDS", 4.0)
    monkeypatch.setattr(writer_lease, "RENEW_SECONDS", 1.0)
    monkeypatch.setattr(writer_lease, "POLL_SECONDS", 0.2)


def machine(model_dir: str, tmp_path, name: str) -> ModelDirectory:
    return ModelDirectory(model_dir, cache_dir=tmp_path / name)


def test_a_second_writer_on_another_machine_fails_naming_the_holder(object_store, tmp_path):
    model_dir = f"{object_store}/models/run"
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
    assert storage.publisher_for(model_dir).read(writer_lease.WRITER_LEASE) is None  # released: removed
    third = machine(model_dir, tmp_path, "c")
    third.claim_writer()  # a released lease is free at once
    third.release_writer()


def test_the_lease_of_a_killed_writer_is_taken_over_after_it_runs_out(object_store, tmp_path):
    model_dir = f"{object_store}/models/run"
    killed = {"holder": "pid 1 on gone-host since then", "token": "dead", "renewed_at": time.time()}
    storage.publisher_for(model_dir).publish(writer_lease.WRITER_LEASE, json.dumps(killed).encode())
    newcomer = machine(model_dir, tmp_path, "a")
    started = time.monotonic()
    newcomer.claim_writer()
    try:
        assert 3.0 < time.monotonic() - started < 15.0
        lease = json.loads(storage.publisher_for(model_dir).read(writer_lease.WRITER_LEASE))
        assert lease["token"] != "dead" and lease["holder"].startswith("pid ")
    finally:
        newcomer.release_writer()


def test_a_writer_whose_lease_was_taken_stops_at_its_next_push(object_store, tmp_path):
    model_dir = f"{object_store}/models/run"
    writer = machine(model_dir, tmp_path, "a")
    writer.claim_writer()
    try:
        intruder = {"holder": "pid 2 on other-host since now", "token": "other", "renewed_at": time.time()}
        storage.publisher_for(model_dir).publish(writer_lease.WRITER_LEASE, json.dumps(intruder).encode())
        time.sleep(2.5)  # the writer's next renewal finds the lease changed
        (writer.local / "ckpt-1.index").write_bytes(b"x")
        with pytest.raises(WriterClaimError, match=r"another writer took over; this one stops"):
            writer.push()
    finally:
        writer.release_writer()
