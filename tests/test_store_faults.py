"""One policy for every call to an object store: a transient failure (503 SlowDown, a body cut short) is retried
within a bounded time; one that outlasts the retries ends in one line naming the object, with the retryable exit
code. Played by a proxy in front of the S3 server on 127.0.0.1 that injects the faults."""

from __future__ import annotations

import logging
import time

import pytest

from components.common import exit_codes, filesystem, object_stores, storage, stores
from components.common.cli import report_error
from tests.fake_s3_stores import Fault, S3Proxy


@pytest.fixture
def faulty(s3_server, s3_bucket, monkeypatch):
    with S3Proxy(s3_server) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setattr(object_stores, "RETRY_BASE_SECONDS", 0.05)
        object_stores.reset_clients()
        yield proxy, storage.publisher_for(f"s3://{s3_bucket}/data")
        object_stores.reset_clients()


CONTENT = bytes(range(256)) * 4096  # 1 MiB


@pytest.mark.parametrize("times", [1, 3])
def test_a_read_cut_short_is_read_again_and_whole(faulty, times):
    proxy, publisher = faulty
    publisher.publish("shard-0", CONTENT)
    proxy.faults.append(Fault("GET", "*shard-0", "cut", times))
    assert publisher.read("shard-0") == CONTENT
    cut = [request for request in proxy.requests if request[0] == "GET" and request[1].endswith("shard-0")]
    assert len(cut) == times + 1


def test_a_read_cut_short_every_time_ends_in_one_retryable_line_naming_the_object(faulty, caplog):
    proxy, publisher = faulty
    publisher.publish("shard-0", CONTENT)
    proxy.faults.append(Fault("GET", "*shard-0", "cut"))
    with pytest.raises(filesystem.StoreUnavailableError) as failed:
        publisher.read("shard-0")
    message = str(failed.value)
    assert message.startswith(f"{publisher.uri('shard-0')}: the store at {proxy.url} kept failing"), message
    assert "ResponseStreamingError" in message or "IncompleteRead" in message
    assert report_error(failed.value, "stage", (ValueError,)) == exit_codes.STORE_UNAVAILABLE
    (line,) = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert "\n" not in line and "exit 145" in line


@pytest.mark.parametrize("method", ["PUT", "GET", "HEAD"])
def test_slow_down_answers_are_retried(faulty, method):
    proxy, publisher = faulty
    if method != "PUT":
        publisher.publish("current.json", b"{}")
    proxy.faults.append(Fault(method, "*current.json", "503", 2))
    if method == "PUT":
        publisher.publish("current.json", b'{"version": 1}', expected_version=stores.ABSENT)
        assert publisher.read("current.json") == b'{"version": 1}'
    elif method == "GET":
        assert publisher.read("current.json") == b"{}"
    else:
        assert publisher.checksum("current.json")[0] == 2
    assert [request[2] for request in proxy.requests if request[0] == method].count(503) == 2


@pytest.mark.parametrize("method", ["PUT", "GET"])
def test_a_store_that_keeps_answering_slow_down_is_retryable_in_one_line_within_a_bound(faulty, method):
    proxy, publisher = faulty
    publisher.publish("current.json", b"{}")
    proxy.faults.append(Fault(method, "*current.json", "503"))
    started = time.monotonic()
    kept_failing = r"current\.json: the store at .* kept failing .*503 SlowDown"
    with pytest.raises(filesystem.StoreUnavailableError, match=kept_failing):
        if method == "PUT":
            publisher.publish("current.json", b'{"version": 2}', expected_version=publisher.version("current.json"))
        else:
            publisher.read("current.json")
    assert time.monotonic() - started < 120
