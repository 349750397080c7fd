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

from components.common import filesystem, object_stores, storage, stores
from components.common.model_directory import ModelDirectory
from tests.fake_s3_stores import S3Proxy

REPOSITORY = Path(__file__).resolve().parents[1]
UNSAFE = ["ignored", "check-then-write"]


@pytest.fixture
def store(s3_server, s3_bucket, monkeypatch, request):
    """A proxy playing the store `request.param` in front of the S3 server; the environment points at it."""
    with S3Proxy(s3_server, conditions=request.param) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.delenv(filesystem.ASSUME_SINGLE_WRITER, raising=False)
        object_stores.reset_clients()
        yield proxy, f"s3://{s3_bucket}"
        object_stores.reset_clients()


def stored_keys(root: str) -> list[str]:
    _scheme, bucket, _prefix = filesystem.split_uri(root)
    listed = object_stores.s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(item["Key"] for item in listed)


def prepare(output: str, **options):
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    values = {"source": "synthetic", "synthetic_train_per_class": 4, "synthetic_eval_per_class": 2, **options}
    return prepare_data(PrepareDataConfig(output=output, **values))


@pytest.mark.parametrize("store", UNSAFE, indirect=True)
def test_a_store_without_working_conditional_writes_is_refused_before_anything_is_published(store):
    proxy, root = store
    with pytest.raises(filesystem.UnsafeStoreError) as refused:
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
    with pytest.raises(filesystem.UnsafeStoreError, match="does not honour conditional writes"):
        directory.claim_writer()
    directory.release_writer()
    assert stored_keys(root) == []


@pytest.mark.parametrize("store", ["check-then-write"], indirect=True)
def test_promotion_refuses_it_too(store, tmp_path):
    from components.evaluate import promote
    from tests.builders import tiny_model

    _proxy, root = store
    with pytest.raises(filesystem.UnsafeStoreError, match="does not honour conditional writes"):
        candidate = promote.Candidate(tiny_model(), ["a", "b"], {"metrics": {"accuracy": 0.5}})
        promote.promote(candidate, f"{root}/models", stores.ABSENT)
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


def refused_by_the_cli(root: str) -> str:
    """prepare_data's command line into `root`: refused with exit 2 and one error line, which is returned."""
    completed = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--source", "synthetic", "--output", f"{root}/data"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    (error,) = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    return error


@pytest.mark.parametrize("store", ["check-then-write"], indirect=True)
def test_the_cli_refuses_it_with_one_line_and_exit_code_2(store, tmp_path):
    _proxy, root = store
    assert "does not honour conditional writes" in refused_by_the_cli(root)


@pytest.mark.parametrize("store", ["ignored"], indirect=True)
def test_a_misspelt_single_writer_variable_is_named_not_read_as_no(store, monkeypatch, tmp_path):
    _proxy, root = store
    monkeypatch.setenv(filesystem.ASSUME_SINGLE_WRITER, "ture")
    assert "CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER: 'ture' is neither true" in refused_by_the_cli(root)
    assert stored_keys(root) == []
    for text, assumed in (("on", True), (" 0 ", False), ("", False)):
        monkeypatch.setenv(filesystem.ASSUME_SINGLE_WRITER, text)
        assert filesystem.assume_single_writer() is assumed


def test_the_check_costs_little(s3_bucket):
    """Cheap enough to run once per process and bucket: well under a second against a local server."""
    publisher = storage.publisher_for(f"s3://{s3_bucket}/x")
    started = time.monotonic()
    assert object_stores.conditional_write_problem(publisher) is None
    assert time.monotonic() - started < 5.0


# -- a KFP 2.15+ profile's S3 keys --------------------------------------------------------------------------------

NAMESPACE = "team-a"
BUCKET = "mlpipeline"


@pytest.fixture
def profile_store(s3_server, monkeypatch):
    """KFP's store as a profile's keys see it (tests/fake_s3_stores.py enforces the vendored policies); the bucket
    `mlpipeline` made by the admin, as KFP's installation does."""
    import boto3

    admin = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="admin",
                         aws_secret_access_key="admin")  # fmt: skip
    if BUCKET not in {bucket["Name"] for bucket in admin.list_buckets()["Buckets"]}:
        admin.create_bucket(Bucket=BUCKET)
    with S3Proxy(s3_server, profile=NAMESPACE) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", NAMESPACE)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "profile-key")
        object_stores.reset_clients()
        yield proxy, admin
        object_stores.reset_clients()


def test_nothing_the_pipeline_writes_in_its_documented_set_up_is_outside_a_profiles_prefixes(
    profile_store, tmp_path, monkeypatch
):
    """Source in shared/, pipeline root in private-artifacts/<ns>/ (KFP's default), promotion root in private/<ns>/
    (kept: retention expires private-artifacts/*), TensorBoard on the pipeline root: every request is allowed."""
    import uuid
    from types import SimpleNamespace

    from components.common.model_directory import pipeline_model_directory
    from components.common.tensorboard import local_copy, mirror
    from components.evaluate import promote
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate
    from components.prepare_data.fingerprint import source_fingerprint
    from components.train import loop
    from tests.builders import official_data, tiny_train_config, write_python_archive

    proxy, admin = profile_store
    run = uuid.uuid4().hex[:8]
    archive = write_python_archive(tmp_path / "cifar-10-python.tar.gz", official_data(per_batch=10))
    admin.put_object(Bucket=BUCKET, Key="shared/datasets/cifar-10-python.tar.gz", Body=archive.read_bytes())
    source = f"s3://{BUCKET}/shared/datasets/cifar-10-python.tar.gz"
    root = f"minio://{BUCKET}/private-artifacts/{NAMESPACE}/v2/artifacts/cifar10-pipeline/{run}"
    promotion_root = f"s3://{BUCKET}/private/{NAMESPACE}/cifar10/{run}/models"

    assert source_fingerprint(source).startswith("object:")
    dataset = filesystem.normalize_uri(f"{root}/prepare-data-component/1a2b/dataset")  # where KFP's launcher puts it
    prepare(dataset, source=source, validation_fraction=0.0)
    model = SimpleNamespace(uri=f"{root}/train-component/3c4d/model", path="/minio/x", name="model", metadata={})
    model_dir = pipeline_model_directory(model, run, None, shared=True)
    loop.train(tiny_train_config(dataset, model_dir, train_steps=2, cache_dir=str(tmp_path / "train")))
    result = evaluate(EvaluateConfig(data=dataset, model_dir=model_dir, promote_to=promotion_root,
                                     cache_dir=str(tmp_path / "evaluate")))  # fmt: skip
    assert result.promotion.version == 1
    assert promote.warm_start_checkpoint("", promotion_root, True).startswith(promotion_root)
    logdir = filesystem.normalize_uri(f"s3://{BUCKET}/private-artifacts/{NAMESPACE}/v2/artifacts/cifar10-pipeline")
    assert mirror(logdir, local_copy(logdir, tmp_path / "board")) > 0  # the TensorBoard manifest's logdir
    assert proxy.denied() == [] and len(proxy.requests) > 50


def test_a_location_outside_the_profiles_prefixes_is_access_denied_naming_the_object_and_the_prefixes(
    profile_store, tmp_path
):
    from components.evaluate import promote
    from tests.builders import tiny_model

    proxy, _admin = profile_store
    candidate = promote.Candidate(tiny_model(), ["a", "b"], {"metrics": {"accuracy": 0.5}})
    with pytest.raises(filesystem.StorageError) as denied:
        promote.promote(candidate, f"s3://{BUCKET}/models/cifar10", stores.ABSENT)  # the old documented root
    message = str(denied.value)
    assert message.startswith(f"s3://{BUCKET}/models/cifar10/") and "access denied" in message
    assert "mlpipeline/private/<namespace>/" in message and "refused the credentials" not in message
    assert proxy.denied()


@pytest.mark.parametrize("document", ["README.md", "docs/cluster.md", "manifests/tensorboard.yaml"])
def test_every_object_store_location_the_documentation_gives_is_inside_a_profiles_prefixes(document):
    import fnmatch
    import re

    from tests.fake_s3_stores import profile_object_patterns

    text = (REPOSITORY / document).read_text()
    text = re.sub(r"<your profile namespace>|\$\(POD_NAMESPACE\)|<namespace>", NAMESPACE, text)
    locations = re.findall(r"s3://([a-z0-9][-a-z0-9.]*/[^\s\"'`),]*)", text)
    assert locations, document
    patterns = profile_object_patterns(NAMESPACE)

    def allowed(location: str) -> bool:
        return any(fnmatch.fnmatchcase(location.rstrip("/") + "/x", pattern) for pattern in patterns)

    outside = [f"s3://{location}" for location in locations if not allowed(location)]
    assert outside == [], document
