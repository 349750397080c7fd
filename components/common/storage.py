"""Reading and atomically publishing files on a local disk or on Google Cloud Storage (`gs://bucket/prefix`).

gs:// goes through google-cloud-storage (which honours `STORAGE_EMULATOR_HOST`, so tests use a real
fake-gcs-server), never through TensorFlow's own GCS filesystem.

Publishing rules, the same for both back ends:
- an object appears whole or not at all (local: temporary file + rename; gs://: a single upload);
- `publish` succeeds without writing when identical bytes are already there (so concurrent publishers of
  the same content both succeed);
- `publish(..., expected_version=V)` is a compare-and-swap: it replaces only version V (as returned by
  `read_versioned`; ABSENT for "must not exist"), and a writer that lost the race to different content
  gets `PublishConflictError` naming the object.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Protocol

import google_crc32c

logger = logging.getLogger(__name__)

GCS_SCHEME = "gs://"
CHUNK_BYTES = 8 * 1024 * 1024


class PublishConflictError(RuntimeError):
    """Another writer changed an object to different content while this one was publishing."""


def is_gcs_uri(uri: str) -> bool:
    return str(uri).startswith(GCS_SCHEME)


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """`gs://bucket/a/b` -> (`bucket`, `a/b`)."""
    if not is_gcs_uri(uri):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    bucket, _, name = uri[len(GCS_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} has no bucket name (expected gs://BUCKET/PATH)")
    return bucket, name.strip("/")


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or gs:// URI."""
    if is_gcs_uri(base):
        return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])
    return str(Path(base, *parts))


@functools.lru_cache(maxsize=1)
def gcs_client():
    from google.cloud import storage

    return storage.Client()


def crc32c_base64(data: bytes) -> str:
    """CRC32C as Cloud Storage reports it (base64 of the big-endian 4 bytes)."""
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_bytes(uri: str) -> bytes:
    """The whole content of a local file or gs:// object; FileNotFoundError names it when absent."""
    if is_gcs_uri(uri):
        from google.api_core import exceptions

        bucket, name = split_gcs_uri(uri)
        try:
            return gcs_client().bucket(bucket).blob(name).download_as_bytes()
        except exceptions.NotFound as error:
            raise FileNotFoundError(f"{uri} does not exist") from error
    return Path(uri).read_bytes()


def exists(uri: str) -> bool:
    if is_gcs_uri(uri):
        bucket, name = split_gcs_uri(uri)
        return gcs_client().bucket(bucket).blob(name).exists()
    return Path(uri).exists()


def download_file(uri: str, destination: str | Path) -> None:
    """Copy a gs:// object to a local file atomically (temporary name, then rename)."""
    from google.api_core import exceptions

    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    bucket, name = split_gcs_uri(uri)
    temporary = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.part")
    try:
        gcs_client().bucket(bucket).blob(name).download_to_filename(str(temporary))
        os.replace(temporary, destination)
    except exceptions.NotFound as error:
        raise FileNotFoundError(f"{uri} does not exist") from error
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a local file so that readers see the old content or the new, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


ABSENT = "absent"  # the version of an object that does not exist


class Publisher(Protocol):
    """Objects under one root (a local folder or a gs:// prefix), named by relative paths."""

    root: str

    def uri(self, name: str) -> str: ...
    def read(self, name: str) -> bytes | None: ...
    def read_versioned(self, name: str) -> tuple[bytes | None, str]: ...
    def checksum(self, name: str) -> tuple[int, str] | None: ...
    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> None: ...
    def withdraw(self, name: str) -> None: ...
    def list(self, prefix: str = "") -> list[str]: ...


def _conflict(uri: str) -> PublishConflictError:
    return PublishConflictError(f"{uri} was changed by another writer with different content while publishing")


class LocalPublisher:
    """A local folder. Compare-and-swap publishing holds an exclusive lock on `<root>/.publish.lock`."""

    def __init__(self, root: str | Path):
        self.root = str(root)

    def uri(self, name: str) -> str:
        return str(Path(self.root, name))

    def read(self, name: str) -> bytes | None:
        try:
            return Path(self.root, name).read_bytes()
        except FileNotFoundError:
            return None

    def read_versioned(self, name: str) -> tuple[bytes | None, str]:
        data = self.read(name)
        return data, _content_version(data)

    def checksum(self, name: str) -> tuple[int, str] | None:
        """(size in bytes, CRC32C base64) of an object, or None when it does not exist."""
        data = self.read(name)
        return None if data is None else (len(data), crc32c_base64(data))

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> None:
        if expected_version is None:
            atomic_write_bytes(Path(self.root, name), data)  # renaming over identical bytes changes nothing
            return
        Path(self.root).mkdir(parents=True, exist_ok=True)
        with open(Path(self.root, ".publish.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current, version = self.read_versioned(name)
            if current == data:
                return
            if version != expected_version:
                raise _conflict(self.uri(name))
            atomic_write_bytes(Path(self.root, name), data)

    def withdraw(self, name: str) -> None:
        Path(self.root, name).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        root = Path(self.root)
        if not root.exists():
            return []
        names = (path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
        return sorted(name for name in names if name.startswith(prefix) and not Path(name).name.startswith("."))


def _content_version(data: bytes | None) -> str:
    return ABSENT if data is None else f"{len(data)}:{crc32c_base64(data)}"


class GcsPublisher:
    """A gs:// prefix. Every write carries a generation precondition, so a lost race is detected, never silent."""

    def __init__(self, root_uri: str):
        self.root = root_uri.rstrip("/")
        self.bucket_name, self.prefix = split_gcs_uri(self.root)

    def _bucket(self):
        return gcs_client().bucket(self.bucket_name)

    def _object_name(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str) -> str:
        return f"{GCS_SCHEME}{self.bucket_name}/{self._object_name(name)}"

    def read(self, name: str) -> bytes | None:
        return self.read_versioned(name)[0]

    def read_versioned(self, name: str) -> tuple[bytes | None, str]:
        """The content and generation of an object, read together (the download is pinned to the generation)."""
        blob = self._get(name)
        if blob is None:
            return None, ABSENT
        from google.api_core import exceptions

        try:
            return blob.download_as_bytes(if_generation_match=blob.generation), str(blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return self.read_versioned(name)  # replaced between the two calls: read the new version

    def _get(self, name: str):
        return self._bucket().get_blob(self._object_name(name))

    def checksum(self, name: str) -> tuple[int, str] | None:
        blob = self._get(name)
        return None if blob is None else (blob.size, blob.crc32c)

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> None:
        """Upload `data`; with `expected_version` only over that generation (ABSENT: only if nothing is there)."""
        from google.api_core import exceptions

        wanted = (len(data), crc32c_base64(data))
        if expected_version is None:
            blob = self._get(name)
            if blob is not None and (blob.size, blob.crc32c) == wanted:
                return
            generation = blob.generation if blob is not None else 0
        else:
            generation = 0 if expected_version == ABSENT else int(expected_version)
        try:
            self._bucket().blob(self._object_name(name)).upload_from_string(
                data, if_generation_match=generation, checksum="crc32c"
            )
        except exceptions.PreconditionFailed:
            if self.checksum(name) == wanted:
                return  # another writer published the same bytes
            raise _conflict(self.uri(name)) from None

    def withdraw(self, name: str) -> None:
        from google.api_core import exceptions

        blob = self._get(name)
        if blob is None:
            return
        try:
            blob.delete(if_generation_match=blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            logger.info("%s was already removed or replaced by another writer", self.uri(name))

    def list(self, prefix: str = "") -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        blobs = gcs_client().list_blobs(self.bucket_name, prefix=start + prefix)
        names = (blob.name[len(start) :] for blob in blobs)
        return sorted(name for name in names if name and not name.rsplit("/", 1)[-1].startswith("."))


def publisher_for(root: str) -> LocalPublisher | GcsPublisher:
    return GcsPublisher(root) if is_gcs_uri(root) else LocalPublisher(root)
