"""The storage layer's addressing and errors: KFP's minio:// URIs, where a pipeline's model directory lives, and
clear one-line errors when an object store cannot be reached."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.common import filesystem, object_stores, storage
from components.common.model_directory import artifact_location, pipeline_model_directory

REPOSITORY = Path(__file__).resolve().parents[1]
RUN_ID = "8d3f2a10-0b7e-4c38-9a55-2f1e3c4d5e6f"


def artifact(uri: str, path: str, name: str = "model"):
    return SimpleNamespace(uri=uri, path=path, name=name, metadata={})


def test_kfp_minio_uris_are_s3_uris():
    assert filesystem.normalize_uri("minio://mlpipeline/v2/artifacts/x") == "s3://mlpipeline/v2/artifacts/x"
    assert filesystem.split_uri("minio://mlpipeline/a/b") == ("s3://", "mlpipeline", "a/b")
    assert isinstance(storage.publisher_for("minio://mlpipeline/v2"), object_stores.S3Publisher)
    assert storage.publisher_for("minio://mlpipeline/v2").uri("x") == "s3://mlpipeline/v2/x"
    assert filesystem.join("minio://bkb/p", "q") == "s3://bkb/p/q"


def test_the_model_directory_of_a_run_outlives_the_pod_and_the_attempt():
    # KFP 2.x backends salt an output artifact's URI per attempt; the run's own folder does not change.
    first = artifact(
        f"minio://mlpipeline/v2/artifacts/cifar10-pipeline/{RUN_ID}/train-component/a1b2/model", "/minio/x"
    )
    retry = artifact(
        f"minio://mlpipeline/v2/artifacts/cifar10-pipeline/{RUN_ID}/train-component/c3d4/model", "/minio/y"
    )
    expected = f"s3://mlpipeline/v2/artifacts/cifar10-pipeline/{RUN_ID}/model-directory"
    assert pipeline_model_directory(first, RUN_ID, None, shared=True) == expected
    assert pipeline_model_directory(retry, RUN_ID, None, shared=False) == expected
    assert pipeline_model_directory(first, RUN_ID, "s3://models/run-7", shared=True) == "s3://models/run-7"
    local = artifact("/tmp/runs/train-component/model", "/tmp/runs/train-component/model")  # kfp.local
    assert pipeline_model_directory(local, RUN_ID, None, shared=False) == "/tmp/runs/train-component/model"


def test_a_tfjob_refuses_pod_local_locations_and_says_what_to_set():
    local = artifact("/tmp/runs/train-component/model", "/tmp/runs/train-component/model")
    with pytest.raises(ValueError, match=r"model_dir: .* is pod-local; .*pipeline_root on gs:// or s3://"):
        pipeline_model_directory(local, RUN_ID, None, shared=True)
    dataset = artifact("/tmp/runs/prepare/dataset", "/tmp/runs/prepare/dataset", name="dataset")
    with pytest.raises(ValueError, match=r"dataset: .* is pod-local"):
        artifact_location(dataset, shared=True)
    remote = artifact("minio://mlpipeline/v2/artifacts/p/r/prepare/dataset", "/minio/mlpipeline/v2/x", "dataset")
    assert artifact_location(remote, shared=True) == "s3://mlpipeline/v2/artifacts/p/r/prepare/dataset"
    assert artifact_location(remote, shared=False) == "/minio/mlpipeline/v2/x"  # this pod's downloaded copy


def prepare_data_into(output: str, tmp_path, **environment) -> subprocess.CompletedProcess:
    """The prepare_data CLI writing synthetic data to `output`, with a bare environment plus `environment`."""
    return subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--source", "synthetic", "--output", output],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), **environment},
    )


def test_an_unreachable_s3_endpoint_is_one_clear_line_and_exit_code_2(tmp_path):
    started = time.monotonic()
    completed = prepare_data_into(
        "s3://bucket/data", tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="a",
        AWS_SECRET_ACCESS_KEY="b",
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "s3://bucket/data/manifest.json: cannot reach the S3 endpoint http://127.0.0.1:9" in completed.stderr
    assert "Traceback" not in completed.stderr and time.monotonic() - started < 60


def test_missing_s3_credentials_are_one_clear_line(tmp_path, s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    object_stores.reset_clients()
    try:
        with pytest.raises(filesystem.StorageError, match=r"s3://bucket/x: no S3 credentials: set AWS_ACCESS_KEY_ID"):
            storage.read_bytes("s3://bucket/x")
    finally:
        object_stores.reset_clients()


def test_an_unreachable_cloud_storage_endpoint_is_one_clear_line_in_seconds(tmp_path):
    started = time.monotonic()
    completed = prepare_data_into("gs://bucket/data", tmp_path, STORAGE_EMULATOR_HOST="http://127.0.0.1:9")
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert len(errors) == 1 and re.search(
        r"gs://bucket/data/manifest\.json: cannot reach Cloud Storage at http://127\.0\.0\.1:9", errors[0]
    ), completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr and time.monotonic() - started < 60


def test_unusable_cloud_storage_credentials_are_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    monkeypatch.setattr(
        object_stores, "_reachable", lambda endpoint: True
    )  # no network here: only the credentials fail
    object_stores.reset_clients()
    try:
        with pytest.raises(
            filesystem.StorageError,
            match=r"gs://bucket/x: no usable Google Cloud credentials \(.*missing-key\.json.*\): set "
            r"GOOGLE_APPLICATION_CREDENTIALS",
        ):
            storage.read_bytes("gs://bucket/x")
    finally:
        object_stores.reset_clients()


def test_the_tensorboard_button_only_where_kfps_viewer_can_read_the_logs(monkeypatch):
    """KFP's viewer pod (TensorFlow 2.2.2, no S3 settings) shows an empty board for s3:// logs."""
    from components.train.kfp_run import VIEWER_READS_S3, tensorboard_note, tensorboard_outputs

    monkeypatch.delenv(VIEWER_READS_S3, raising=False)
    assert tensorboard_outputs("gs://bucket/run/model") == [{"type": "tensorboard", "source": "gs://bucket/run/model"}]
    assert tensorboard_outputs("s3://mlpipeline/private-artifacts/team-a/run/model") == []
    note = tensorboard_note("s3://mlpipeline/private-artifacts/team-a/run/model")  # the step's Markdown output
    assert "kubectl port-forward svc/cifar10-pipeline-tensorboard" in note and "Start TensorBoard" not in note
    assert "make tensorboard LOGDIR=s3://mlpipeline/private-artifacts/team-a/run/model" in note
    monkeypatch.setenv(VIEWER_READS_S3, "true")  # the admin gave the viewer the store's settings
    assert tensorboard_outputs("s3://mlpipeline/x")[0]["type"] == "tensorboard"
    assert "Start TensorBoard" in tensorboard_note("s3://mlpipeline/x")


def test_the_model_artifact_holds_the_trainings_metrics_and_config_when_the_model_directory_is_in_a_store(
    gcs_bucket, tmp_path
):
    """On a cluster the model directory stays in the run's folder of the store; the artifact KFP uploads (its
    lineage and download) gets the metrics, the config and where the directory is."""
    from components.train.kfp_run import write_model_artifact

    model_dir = f"gs://{gcs_bucket}/pipeline/run-1/model-directory"
    store = storage.publisher_for(model_dir)
    store.publish("train_metrics.json", b'{"step": 4}')
    store.publish("config.json", b'{"depth": 8}')
    artifact = SimpleNamespace(path=str(tmp_path / "outputs" / "model"))
    write_model_artifact(artifact, model_dir)
    folder = Path(artifact.path)
    assert json.loads((folder / "train_metrics.json").read_text()) == {"step": 4}
    assert json.loads((folder / "config.json").read_text()) == {"depth": 8}
    assert (folder / "model_directory.txt").read_text().strip() == model_dir


@pytest.mark.parametrize(
    ("resolvable", "expected"),
    [
        ({"seaweedfs.kubeflow", "minio-service.kubeflow"}, "http://seaweedfs.kubeflow:8333"),  # Kubeflow 1.11, 26.03
        ({"minio-service.kubeflow"}, "http://minio-service.kubeflow:9000"),  # Kubeflow 1.9, 1.10
        (set(), None),  # no Kubeflow store: AWS S3
    ],
)
def test_a_step_in_a_pod_finds_its_releases_object_store_without_a_setting(monkeypatch, resolvable, expected):
    """No AWS_ENDPOINT_URL: in a pod, the store the Kubeflow release installed, by its service's name (names are
    resolved by a stand-in resolver: nothing here reaches a network); outside a pod, or with a setting, no guess."""
    import socket

    from components.common import object_stores

    def resolve(name, *_arguments):
        if name in resolvable:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    object_stores.kubeflow_store.cache_clear()
    try:
        assert object_stores.s3_endpoint() == expected
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
        assert object_stores.s3_endpoint() == "http://127.0.0.1:9000"  # a setting wins
        monkeypatch.delenv("AWS_ENDPOINT_URL")
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
        assert object_stores.s3_endpoint() is None  # outside a pod: AWS S3, as boto3 would
    finally:
        object_stores.kubeflow_store.cache_clear()


def test_a_writer_stopped_inside_a_local_roots_lock_is_named_and_the_wait_is_bounded(tmp_path, monkeypatch, caplog):
    """A promotion stopped (SIGSTOP, Ctrl-Z) while it holds the local root's .publish.lock: the next writer says
    after a few seconds whom it waits for and that it is stopped, and gives up after a bound in one line, changing
    nothing."""
    import os
    import signal
    import subprocess
    import sys

    from components.common import stores
    from tests.builders import REPOSITORY

    holder = subprocess.Popen(
        [sys.executable, "-c", "import os, signal, sys; from components.common import stores\n"
         f"with stores.root_lock({str(tmp_path)!r}):\n"
         "    print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP)"],
        cwd=REPOSITORY, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(stores, "LOCK_NOTICE_SECONDS", 0.5)
        monkeypatch.setattr(stores, "LOCK_WAIT_SECONDS", 2.0)
        with caplog.at_level("WARNING"), pytest.raises(filesystem.StorageError) as refused:
            stores.LocalPublisher(tmp_path).publish("current.json", b"{}", stores.ABSENT)
        assert f"held for 2 s by pid {holder.pid} on " in str(refused.value) and "(stopped)" in str(refused.value)
        assert f"waiting for {tmp_path / '.publish.lock'}, held by pid {holder.pid}" in caplog.text
        assert not (tmp_path / "current.json").exists()
        os.kill(holder.pid, signal.SIGCONT)  # continued, it lets go: the next write goes through
        holder.wait(timeout=30)
        stores.LocalPublisher(tmp_path).publish("current.json", b"{}", stores.ABSENT)
    finally:
        holder.kill()
