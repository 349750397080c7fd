"""What the stages guarantee rests on the store honouring conditional writes; the stores Kubeflow ships do not all
honour them. Played by proxies in front of a real S3 server (tests/fake_s3_stores.py): a store that ignores the
preconditions (MinIO 2019) and one that checks, then writes (SeaweedFS 4.00-4.16), are refused before the first
write, by every writer (dataset publish, the model directory's lease, promotion), unless a single writer is assumed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import object_stores, storage
from components.common.model_directory import ModelDirectory
from tests.fake_s3_stores import S3Proxy

REPOSITORY = Path(__file__).resolve().parents[1]
UNSAFE = ["ignored", "check-then-write"]


@pytest.fixture
def store(s3_server, s3_bucket, monkeypatch, request):
    """A proxy playing the store `request.param` in front of the S3 server; the environment points at it."""
    with S3Proxy(s3_server, conditions=request.param) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.delenv(storage.ASSUME_SINGLE_WRITER, raising=False)
        object_stores.reset_clients()
        yield proxy, f"s3://{s3_bucket}"
        object_stores.reset_clients()


def stored_keys(root: str) -> list[str]:
    _scheme, bucket, _prefix = storage.split_uri(root)
    listed = object_stores.s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(item["Key"] for item in listed)


def prepare(output: str, **options):
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    return prepare_data(PrepareDataConfig(output=output, source="synthetic", synthetic_train_per_class=4,
                                          synthetic_eval_per_class=2, **options))  # fmt: skip


@pytest.mark.parametrize("store", UNSAFE, indirect=True)
def test_a_store_without_working_conditional_writes_is_refused_before_anything_is_published(store):
    proxy, root = store
    with pytest.raises(storage.UnsafeStoreError) as refused:
        prepare(f"{root}/datasets/cifar10")
    message = str(refused.value)
    assert f"the S3 store at {proxy.url} does not honour conditional writes" in message
    assert ("second create-if-absent" if proxy.conditions == "ignored" else "concurrent create-if-absent") in message
    assert "SeaweedFS 4.17 or newer" in message and "CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER=1" in message
    assert stored_keys(root) == []  # nothing published, and the probes are gone


@pytest.mark.parametrize("store", UNSAFE, indirect=True)
def test_the_model_directorys_writer_lease_refuses_it_too(store, tmp_path):
    _proxy, root = store
    directory = ModelDirectory(f"{root}/runs/1/model-directory", tmp_path / "cache")
    with pytest.raises(storage.UnsafeStoreError, match="does not honour conditional writes"):
        directory.claim_writer()
    directory.release_writer()
    assert stored_keys(root) == []


@pytest.mark.parametrize("store", ["check-then-write"], indirect=True)
def test_promotion_refuses_it_too(store, tmp_path):
    from components.evaluate import promote
    from tests.builders import tiny_model

    _proxy, root = store
    with pytest.raises(storage.UnsafeStoreError, match="does not honour conditional writes"):
        candidate = promote.Candidate(tiny_model(), ["a", "b"], {"metrics": {"accuracy": 0.5}})
        promote.promote(candidate, f"{root}/models", storage.ABSENT)
    assert stored_keys(root) == []


@pytest.mark.parametrize("store", ["ignored"], indirect=True)
def test_assuming_a_single_writer_goes_on_and_says_what_is_not_guaranteed(store, caplog):
    _proxy, root = store
    with caplog.at_level("WARNING"):
        result = prepare(f"{root}/datasets/cifar10", assume_single_writer=True)
    assert result.manifest.splits["train"].num_examples > 0 and "datasets/cifar10/manifest.json" in stored_keys(root)
    assert "a second create-if-absent PUT" in caplog.text
    assert "going on because a single writer is assumed" in caplog.text and "NOT detected" in caplog.text


@pytest.mark.parametrize("store", ["honoured"], indirect=True)
def test_a_conforming_store_is_checked_once_per_process_and_bucket(store):
    proxy, root = store
    prepare(f"{root}/datasets/a")
    prepare(f"{root}/datasets/b")
    probes = [request for request in proxy.requests if ".store-check/" in request[1]]
    assert 0 < len(probes) <= 12  # one check: 3 PUTs, the race's 6, 2 deletes
    assert not any(key.startswith("datasets/a/.store-check") for key in stored_keys(root))


@pytest.mark.parametrize("store", ["check-then-write"], indirect=True)
def test_the_cli_refuses_it_with_one_line_and_exit_code_2(store, tmp_path):
    _proxy, root = store
    completed = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--source", "synthetic", "--output", f"{root}/data"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr[-2000:]
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "does not honour conditional writes" in errors[0]
    assert "Traceback" not in completed.stderr


def test_the_check_costs_little(s3_bucket):
    """Cheap enough to run once per process and bucket: well under a second against a local server."""
    publisher = storage.publisher_for(f"s3://{s3_bucket}/x")
    started = time.monotonic()
    assert object_stores.conditional_write_problem(publisher) is None
    assert time.monotonic() - started < 5.0
