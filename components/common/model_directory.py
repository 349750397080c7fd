"""The model directory: the one place every stage reads and writes a trained model through, and where it lives.

    <model_dir>/config.json            the resolved train config (written by train)
    <model_dir>/train_metrics.json     the final step, metrics and checkpoint (written by train when it ends)
    <model_dir>/ckpt-N.*, checkpoint   checkpoints (train)
    <model_dir>/train/, eval/          TensorBoard summaries (train, evaluate)
    <model_dir>/eval_metrics.json      the evaluation's summary (evaluate)

It is a local folder or a gs:// / s3:// prefix. In a KFP pipeline it is placed so that it outlives the step's
pod (see `pipeline_model_directory`): every TFJob worker and every retried attempt of the step reach it.
Its one writer is claimed by `ModelDirectory.claim_writer`: a lock file on this machine and, for a remote
directory, a lease object in the store (see `WriterLease`). This module imports no TensorFlow, so the TFJob
launching step can run in a small image.

Over 300 lines: the whole contract in one place (layout, location in a pipeline, the mirror, the writer's lock and
lease), which is this module's point.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.dataset import default_cache_dir

logger = logging.getLogger(__name__)

RESOLVED_CONFIG = "config.json"
TRAIN_METRICS = "train_metrics.json"
EVAL_METRICS = "eval_metrics.json"
CHECKPOINT_PREFIX = "ckpt"
TRAIN_LOGS = "train"
EVAL_LOGS = "eval"
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"  # how TensorFlow names a variable's value inside a checkpoint
WRITER_LOCK = ".writer.lock"
RUN_MODEL_DIRECTORY = "model-directory"  # under `<pipeline root>/<pipeline>/<run id>/`, shared by the run's attempts


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected, or a warm start that matched nothing."""


def artifact_location(artifact: Any, shared: bool = False) -> str:
    """Where to read a KFP input artifact: its pod-local copy, or (`shared`: for other pods) its object-store URI.

    On a cluster the launcher downloads inputs to `artifact.path`, which only this pod sees; other pods (TFJob
    workers) need `artifact.uri` (`minio://...` in KFP's default store, mapped to s3://; or gs://, s3://)."""
    uri = storage.normalize_uri(artifact.uri or "")
    if shared:
        if not storage.is_remote(uri):
            raise ValueError(
                f"{artifact.name or 'artifact'}: {artifact.path} is pod-local ({artifact.uri!r}); the TFJob's workers "
                "run in other pods and cannot read it. Run the pipeline with its default object store (KFP's "
                "MinIO/SeaweedFS) or a pipeline_root on gs:// or s3://"
            )
        return uri
    return artifact.path


def pipeline_model_directory(model_artifact: Any, run_id: str, explicit: str | None, shared: bool) -> str:
    """The train step's model directory in a pipeline run.

    `explicit` wins. Otherwise, when the artifact lives in an object store, a folder of the run itself
    (`<pipeline root>/<pipeline>/<run id>/model-directory`): the artifact's own URI may change from one attempt of
    the step to the next (newer KFP backends salt it per pod), and checkpoints must survive into the retry.
    Otherwise (kfp.local, or no run id) the artifact's own folder. `shared` (a TFJob) requires an object store."""
    if explicit:
        location = storage.normalize_uri(explicit)
    else:
        uri = storage.normalize_uri(model_artifact.uri or "")
        if storage.is_remote(uri):
            marker = f"/{run_id}/" if run_id else None
            location = uri[: uri.index(marker) + len(marker)] + RUN_MODEL_DIRECTORY if marker and marker in uri else uri
        else:
            location = model_artifact.path
    if shared and not storage.is_remote(location):
        raise ValueError(
            f"model_dir: {location} is pod-local; the TFJob's workers run in other pods and cannot write it. Run "
            "the pipeline with its default object store (KFP's MinIO/SeaweedFS) or a pipeline_root on gs:// or "
            "s3://, or give the train step a model_dir on gs:// or s3://"
        )
    return location


class ModelDirectory:
    """The model directory as a local path TensorFlow writes to, mirrored to gs:// or s3:// when it is remote."""

    def __init__(self, uri: str, cache_dir: str | Path | None = None, create: bool = True):
        """`create=False` (for readers): a local directory must already exist."""
        self.uri = storage.normalize_uri(uri).rstrip("/")
        self.remote = storage.is_remote(uri)
        if self.remote:
            key = hashlib.sha256(self.uri.encode()).hexdigest()[:16]
            self.local = Path(cache_dir or default_cache_dir()) / "model_dirs" / key
        else:
            self.local = Path(uri)
            if not create and not self.local.is_dir():
                raise CheckpointError(f"model_dir: {uri} is not a directory (nothing was trained there)")
        self.local.mkdir(parents=True, exist_ok=True)
        self._pushed: dict[str, tuple[int, int]] = {}
        self._writer_lock = None  # the open lock file while this process is the writer
        self._lease: WriterLease | None = None  # and, for a remote directory, the lease in the store

    def claim_writer(self) -> None:
        """Be the only writer of this model directory while this process lives: an exclusive lock on
        `.writer.lock` in the local folder (or mirror), which the kernel releases when the process ends, however
        it ends, so a claim left by a dead process is simply taken over. A second writer fails at once. A remote
        directory is also claimed across machines, by a lease in the store (see writer_lease.py)."""
        path = self.local / WRITER_LOCK
        handle = open(path, "a+")  # noqa: SIM115 (held open for the life of the process)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CheckpointError(
                f"model_dir: {self.uri} is being written by {holder}; a model directory has one writer at a time "
                "(wait for it to end, stop it, or give another --model-dir)"
            ) from None
        holder = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"
        handle.seek(0)
        handle.truncate()
        handle.write(holder + "\n")
        handle.flush()
        self._writer_lock = handle
        if self.remote:
            lease = WriterLease(self.uri, holder)
            try:
                lease.acquire()
            except BaseException:
                self.release_writer()
                raise
            self._lease = lease
        storage.remove_stale_temporaries(self.local)  # the only writer now: what a killed one left is garbage

    def release_writer(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._writer_lock is not None:
            self._writer_lock.close()
            self._writer_lock = None

    def pull(self) -> None:
        """Bring the remote directory's files down (resume needs its checkpoints)."""
        if not self.remote:
            return
        publisher = storage.publisher_for(self.uri)
        names = publisher.list()
        for name in names:
            target = self.local / name
            checksum = publisher.checksum(name)
            if target.exists() and checksum == (target.stat().st_size, storage.crc32c_base64(target.read_bytes())):
                continue
            storage.download_file(publisher.uri(name), target)
        logger.info("pulled %d file(s) of %s into %s", len(names), self.uri, self.local)
        self._remember_all()

    def push(self, remove_deleted_checkpoints: bool = False) -> None:
        """Upload files that are new or changed since the last push; the checkpoint index goes last.

        `remove_deleted_checkpoints` (the trainer's max_to_keep) also removes remote checkpoints that are
        gone locally; a reader such as the evaluator never does, or it could remove ones it has not pulled.
        """
        if not self.remote:
            return
        if self._lease is not None:
            self._lease.check()
        publisher = storage.publisher_for(self.uri)
        changed = [
            path
            for path in sorted(self.local.rglob("*"))
            if path.is_file() and not path.name.startswith(".") and self._pushed.get(str(path)) != self._signature(path)
        ]
        changed.sort(key=lambda path: path.name == "checkpoint")  # the index that names the latest, last
        for path in changed:
            publisher.publish(path.relative_to(self.local).as_posix(), path.read_bytes())
            self._pushed[str(path)] = self._signature(path)
        if not remove_deleted_checkpoints:
            return
        remote_files = set(publisher.list())
        local_files = {path.relative_to(self.local).as_posix() for path in self.local.rglob("*") if path.is_file()}
        for stale in sorted(remote_files - local_files):
            if stale.startswith(f"{CHECKPOINT_PREFIX}-"):  # removed locally by max_to_keep
                publisher.withdraw(stale)

    @staticmethod
    def _signature(path: Path) -> tuple[int, int]:
        status = path.stat()
        return status.st_size, status.st_mtime_ns

    def _remember_all(self) -> None:
        for path in self.local.rglob("*"):
            if path.is_file():
                self._pushed[str(path)] = self._signature(path)


# -- the writer lease of a remote model directory ------------------------------------------------------------
# One writer at a time for a gs:// or s3:// model directory, across machines: a lease object in the store.
# The lease (`.writer-lease.json`: holder, a token, when it was last renewed) is created with create-if-absent and
# renewed every `RENEW_SECONDS` with a compare-and-swap on its version, by a thread, while the writer lives. A
# second writer that finds a lease watches it: a renewal means its holder is alive, and the newcomer fails naming
# it; a lease nobody renews for `LEASE_SECONDS` (its holder was killed) is taken over. A writer whose lease was
# taken over stops at its next push. The lease ends (is removed) when the writer ends normally or by SIGTERM.

WRITER_LEASE = ".writer-lease.json"
LEASE_SECONDS = 90.0  # a lease not renewed for this long belongs to a dead writer
RENEW_SECONDS = 20.0
POLL_SECONDS = 2.0


def _parse(content: bytes | None) -> dict | None:
    try:
        lease = json.loads(content) if content else None
    except ValueError:
        return None
    fields_ok = isinstance(lease, dict) and isinstance(lease.get("renewed_at"), int | float)
    return lease if fields_ok and isinstance(lease.get("token"), str) else None


class WriterLease:
    def __init__(self, uri: str, holder: str):
        self.uri = uri
        self.holder = holder
        self.token = uuid.uuid4().hex
        self.lost = False
        self._publisher = storage.publisher_for(uri)
        self._version: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _record(self) -> bytes:
        return json.dumps({"holder": self.holder, "token": self.token, "renewed_at": time.time()}).encode()

    def acquire(self) -> None:
        """Take the lease, waiting out one that nobody renews; CheckpointError when its holder is alive."""
        watched: tuple[str, float] | None = None  # (version seen, when first seen)
        while True:
            content, version = self._publisher.read_versioned(WRITER_LEASE)
            lease = _parse(content)
            if content is not None and lease is not None and lease["token"] != self.token:
                age = time.time() - lease["renewed_at"]
                if watched is not None and watched[0] != version:
                    raise CheckpointError(
                        f"model_dir: {self.uri} is being written by {lease.get('holder', 'another writer')} (it "
                        "renewed its lease just now); a model directory has one writer at a time (wait for it to "
                        "end, stop it, or give another --model-dir)"
                    )
                if watched is None:
                    watched = (version, time.monotonic())
                    if age < LEASE_SECONDS:
                        logger.warning(
                            "%s has a writer lease of %s, renewed %.0f s ago: watching up to %.0f s whether it is "
                            "alive", self.uri, lease.get("holder"), max(age, 0.0), LEASE_SECONDS - max(age, 0.0),
                        )  # fmt: skip
                if age < LEASE_SECONDS and time.monotonic() - watched[1] < LEASE_SECONDS:
                    time.sleep(POLL_SECONDS)
                    continue
                logger.warning("taking over the writer lease of %s (not renewed for %.0f s)", lease.get("holder"), age)
            try:
                self._publisher.publish(WRITER_LEASE, self._record(), expected_version=version)
            except storage.PublishConflictError:
                continue  # another writer moved first: look again
            self._version = self._publisher.version(WRITER_LEASE)
            break
        self._renewer = threading.Thread(target=self._renew, name="writer-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self._publisher.publish(WRITER_LEASE, self._record(), expected_version=self._version)
                self._version = self._publisher.version(WRITER_LEASE)
            except storage.PublishConflictError:
                self.lost = True
                logger.error("%s: another writer took over this model directory's lease", self.uri)
                return
            except Exception as error:  # a store that is briefly unreachable: try again at the next renewal
                logger.warning("%s: could not renew the writer lease (%s)", self.uri, error)

    def check(self) -> None:
        if self.lost:
            raise CheckpointError(f"model_dir: {self.uri}: another writer took over; this one stops")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.lost or self._version is None:
            return
        lease = _parse(self._publisher.read(WRITER_LEASE))
        if lease is not None and lease["token"] == self.token:
            self._publisher.withdraw(WRITER_LEASE)
        self._version = None
