"""Reading and atomically publishing files on a local disk, Google Cloud Storage (`gs://bucket/prefix`) or an
S3-compatible store (`s3://bucket/prefix`: AWS S3, MinIO, SeaweedFS; `minio://` is KFP's name for the same).

gs:// goes through google-cloud-storage (which honours `STORAGE_EMULATOR_HOST`, so tests use a real
fake-gcs-server), never through TensorFlow's own GCS filesystem. s3:// goes through boto3, configured the
standard AWS way: the endpoint from `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (path-style addressing when
one is set, as MinIO and SeaweedFS need), credentials from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (or any
other source boto3 knows), the region from `AWS_REGION`/`AWS_DEFAULT_REGION` (default us-east-1).

Publishing rules, the same for every back end:
- an object appears whole or not at all (local: temporary file + rename; gs:// and s3://: a single upload);
- `publish` succeeds without writing when identical bytes are already there (so concurrent publishers of
  the same content both succeed);
- `publish(..., expected_version=V)` is a compare-and-swap: it replaces only version V (as returned by
  `read_versioned`; ABSENT for "must not exist"), and a writer that lost the race to different content
  gets `PublishConflictError` naming the object. gs:// uses generation preconditions, s3:// conditional
  writes (`If-Match` on the ETag, `If-None-Match: *`), local folders an exclusive lock.

One protocol with one implementation per store, rather than a generic file-system layer such as fsspec:
the compare-and-swap needs each store's own preconditions, which generic layers do not expose.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import google_crc32c

logger = logging.getLogger(__name__)

GCS_SCHEME = "gs://"
S3_SCHEME = "s3://"
MINIO_SCHEME = "minio://"  # KFP's URI for its default (MinIO or SeaweedFS) artifact store: an S3-compatible bucket
REMOTE_SCHEMES = (GCS_SCHEME, S3_SCHEME, MINIO_SCHEME)
CHUNK_BYTES = 8 * 1024 * 1024
CRC32C_METADATA = "crc32c"  # s3:// objects carry their CRC32C as user metadata (ETags are not always MD5s)


class PublishConflictError(RuntimeError):
    """Another writer changed an object to different content while this one was publishing."""


class StorageError(ValueError):
    """An object store cannot be reached or refuses the credentials: a configuration problem, not a bug."""


class _ClientUnavailableError(StorageError):
    """No client could be made for a store; `reason` says why, for a message that names the object."""

    def __init__(self, scheme: str, reason: str):
        super().__init__(f"{scheme}: {reason}")
        self.reason = reason


def normalize_uri(uri: str) -> str:
    """`minio://bucket/key` (how KFP names artifacts in its default store) -> `s3://bucket/key`; others unchanged."""
    uri = str(uri)
    return S3_SCHEME + uri[len(MINIO_SCHEME) :] if uri.startswith(MINIO_SCHEME) else uri


def is_remote(uri: str) -> bool:
    """True for object-store URIs (gs://, s3://, minio://), False for local paths."""
    return str(uri).startswith(REMOTE_SCHEMES)


def is_gcs_uri(uri: str) -> bool:
    return str(uri).startswith(GCS_SCHEME)


def is_s3_uri(uri: str) -> bool:
    return str(uri).startswith((S3_SCHEME, MINIO_SCHEME))


def split_uri(uri: str) -> tuple[str, str, str]:
    """`gs://bucket/a/b` -> (`gs://`, `bucket`, `a/b`); `minio://` comes back as `s3://`."""
    uri = normalize_uri(uri)
    scheme = next((s for s in (GCS_SCHEME, S3_SCHEME) if uri.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"{uri!r} is not a gs:// or s3:// URI")
    bucket, _, name = uri[len(scheme) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} has no bucket name (expected {scheme}BUCKET/PATH)")
    return scheme, bucket, name.strip("/")


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """`gs://bucket/a/b` -> (`bucket`, `a/b`)."""
    if not is_gcs_uri(uri):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    _scheme, bucket, name = split_uri(uri)
    return bucket, name


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or object-store URI."""
    if is_remote(base):
        return "/".join([normalize_uri(base).rstrip("/"), *(part.strip("/") for part in parts)])
    return str(Path(base, *parts))


def parent_and_name(uri: str) -> tuple[str, str]:
    """(`the folder or prefix`, `the last part`) of a path or URI."""
    if is_remote(uri):
        parent, _, name = normalize_uri(uri).rstrip("/").rpartition("/")
        return parent, name
    path = Path(uri)
    return str(path.parent), path.name


GCS_ENDPOINT = "https://storage.googleapis.com"
_PROBE_ATTEMPTS, _PROBE_TIMEOUT_SECONDS = 3, 5.0


def gcs_endpoint() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST") or GCS_ENDPOINT


def _reachable(endpoint: str) -> bool:
    """Whether a TCP connection to the endpoint opens, tried a few times (the client library would instead retry
    silently for two minutes before failing with a traceback)."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for attempt in range(_PROBE_ATTEMPTS):
        if can_connect(parts.hostname, port, _PROBE_TIMEOUT_SECONDS):
            return True
        if attempt + 1 < _PROBE_ATTEMPTS:
            time.sleep(1.0)
    return False


def can_connect(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to host:port opens (refused, unreachable and unresolvable names are False)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def gcs_client():
    """A Cloud Storage client (the emulator's when `STORAGE_EMULATOR_HOST` is set); StorageError, in seconds, when
    the endpoint cannot be reached (checked directly unless a proxy is configured) or no credentials are found."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    endpoint = gcs_endpoint()
    proxied = any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if (endpoint != GCS_ENDPOINT or not proxied) and not _reachable(endpoint):
        reason = f"cannot reach Cloud Storage at {endpoint} (no connection); check the network"
        raise _ClientUnavailableError(GCS_SCHEME, reason)
    try:
        return storage.Client()
    except DefaultCredentialsError as error:
        raise _ClientUnavailableError(
            GCS_SCHEME,
            f"no usable Google Cloud credentials ({str(error).splitlines()[0][:200]}): set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run under Workload Identity",
        ) from error


def s3_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@functools.lru_cache(maxsize=4)
def _s3_client(endpoint: str | None, region: str):
    import boto3
    from botocore.config import Config

    config = Config(
        # Third-party S3 stores (MinIO, SeaweedFS) reject or mishandle the checksum headers newer botocore sends
        # by default; checksums are ours (CRC32C metadata) and verified on read.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 4, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        s3={"addressing_style": "path"} if endpoint else {},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region, config=config)


def s3_client():
    """A boto3 S3 client for the endpoint and region the environment names now (one per endpoint, reused)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return _s3_client(s3_endpoint(), region)


def reset_clients() -> None:
    """Forget the cached clients (after the environment that configures them changed, e.g. in tests)."""
    gcs_client.cache_clear()
    _s3_client.cache_clear()


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
    """The whole content of a local file or remote object; FileNotFoundError names it when absent."""
    if is_remote(uri):
        parent, name = parent_and_name(uri)
        content = publisher_for(parent).read(name)
        if content is None:
            raise FileNotFoundError(f"{uri} does not exist")
        return content
    return Path(uri).read_bytes()


# -- temporary files: named after their writer, so that what a killed writer left is found and removed ---------

_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{12}\.tmp$")
STALE_TEMPORARY_SECONDS = 24 * 3600  # a temporary of another host is removed only when this old


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def temporary_path(destination: Path) -> Path:
    """Where to write `destination` before renaming it into place: a hidden name recording host and process."""
    return destination.with_name(f".{destination.name}.{_host()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporaries below `folder` whose writer is gone (a process of this host that no longer runs,
    or another host's, a day old): what a killed run left behind. Returns what was removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    host, now = _host(), time.time()
    for path in folder.rglob(".*.tmp"):
        match = _TEMPORARY.match(path.name)
        if not match or not path.is_file():
            continue
        if match["host"] == host:
            stale = not _process_alive(int(match["pid"]))
        else:
            stale = now - path.stat().st_mtime > STALE_TEMPORARY_SECONDS
        if stale:
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        logger.info("removed %d temporary file(s) left by killed runs in %s", len(removed), folder)
    return removed


_SCRATCH_PREFIX = "cifar10-pipeline."
_SCRATCH = re.compile(r"^cifar10-pipeline\.[a-z0-9-]+\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.")


def scratch_directory(purpose: str) -> Path:
    """A private folder in the system's temporary directory, named after this host and process, so that one left
    by a killed process is found and removed by the next (see `remove_stale_scratch`)."""
    remove_stale_scratch()
    return Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{purpose}.{_host()}.{os.getpid()}."))


def remove_stale_scratch() -> None:
    """Remove this host's scratch folders whose process no longer runs."""
    host = _host()
    for path in Path(tempfile.gettempdir()).glob(f"{_SCRATCH_PREFIX}*"):
        match = _SCRATCH.match(path.name)
        if match and match["host"] == host and not _process_alive(int(match["pid"])) and path.is_dir():
            logger.info("removing %s, left by a killed process", path)
            shutil.rmtree(path, ignore_errors=True)


def download_file(uri: str, destination: str | Path) -> None:
    """Copy a remote object to a local file atomically (temporary name, then rename)."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    parent, name = parent_and_name(uri)
    temporary = temporary_path(destination)
    try:
        publisher_for(parent).download(name, temporary)
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a local file so that readers see the old content or the new, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    try:
        with open(temporary, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


ABSENT = "absent"  # the version of an object that does not exist


class Publisher(Protocol):
    """Objects under one root (a local folder, a gs:// or an s3:// prefix), named by relative paths."""

    root: str

    def uri(self, name: str) -> str: ...
    def read(self, name: str) -> bytes | None: ...
    def read_versioned(self, name: str) -> tuple[bytes | None, str]: ...
    def version(self, name: str) -> str: ...
    def checksum(self, name: str) -> tuple[int, str] | None: ...
    def download(self, name: str, destination: Path) -> None: ...
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

    def version(self, name: str) -> str:
        return self.read_versioned(name)[1]

    def checksum(self, name: str) -> tuple[int, str] | None:
        """(size in bytes, CRC32C base64) of an object, or None when it does not exist."""
        data = self.read(name)
        return None if data is None else (len(data), crc32c_base64(data))

    def download(self, name: str, destination: Path) -> None:
        data = self.read(name)
        if data is None:
            raise FileNotFoundError(f"{self.uri(name)} does not exist")
        Path(destination).write_bytes(data)

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
        from google.api_core import exceptions

        blob = self._get(name)
        if blob is None:
            return None, ABSENT
        try:
            with _gcs_errors(self.uri(name)):
                return blob.download_as_bytes(if_generation_match=blob.generation), str(blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return self.read_versioned(name)  # replaced between the two calls: read the new version

    def _get(self, name: str):
        with _gcs_errors(self.uri(name)):
            return self._bucket().get_blob(self._object_name(name))

    def version(self, name: str) -> str:
        blob = self._get(name)
        return ABSENT if blob is None else str(blob.generation)

    def checksum(self, name: str) -> tuple[int, str] | None:
        blob = self._get(name)
        return None if blob is None else (blob.size, blob.crc32c)

    def download(self, name: str, destination: Path) -> None:
        from google.api_core import exceptions

        try:
            with _gcs_errors(self.uri(name)):
                self._bucket().blob(self._object_name(name)).download_to_filename(str(destination))
        except exceptions.NotFound as error:
            raise FileNotFoundError(f"{self.uri(name)} does not exist") from error

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
            with _gcs_errors(self.uri(name)):
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
            with _gcs_errors(self.uri(name)):
                blob.delete(if_generation_match=blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            logger.info("%s was already removed or replaced by another writer", self.uri(name))

    def list(self, prefix: str = "") -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        with _gcs_errors(self.root):
            blobs = list(gcs_client().list_blobs(self.bucket_name, prefix=start + prefix))
        names = (blob.name[len(start) :] for blob in blobs)
        return sorted(name for name in names if name and not name.rsplit("/", 1)[-1].startswith("."))


class S3Publisher:
    """An s3:// prefix on AWS S3 or an S3-compatible store (MinIO, SeaweedFS). Writes are conditional
    (`If-None-Match: *` to create, `If-Match: <ETag>` to replace), so a lost race is detected, never silent.
    Every object carries its CRC32C as user metadata, so checksums do not depend on how the store forms ETags."""

    def __init__(self, root_uri: str):
        self.root = normalize_uri(root_uri).rstrip("/")
        _scheme, self.bucket_name, self.prefix = split_uri(self.root)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str) -> str:
        return f"{S3_SCHEME}{self.bucket_name}/{self._key(name)}"

    def _head(self, name: str) -> dict | None:
        with _s3_errors(self.uri(name)):
            try:
                return s3_client().head_object(Bucket=self.bucket_name, Key=self._key(name))
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    return None
                raise

    def read(self, name: str) -> bytes | None:
        return self.read_versioned(name)[0]

    def read_versioned(self, name: str) -> tuple[bytes | None, str]:
        """The content and ETag of an object, read together (one GET returns both)."""
        with _s3_errors(self.uri(name)):
            try:
                response = s3_client().get_object(Bucket=self.bucket_name, Key=self._key(name))
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    return None, ABSENT
                raise
            return response["Body"].read(), response["ETag"]

    def version(self, name: str) -> str:
        head = self._head(name)
        return ABSENT if head is None else head["ETag"]

    def checksum(self, name: str) -> tuple[int, str] | None:
        head = self._head(name)
        if head is None:
            return None
        return head["ContentLength"], head.get("Metadata", {}).get(CRC32C_METADATA, "")

    def download(self, name: str, destination: Path) -> None:
        with _s3_errors(self.uri(name)):
            try:
                s3_client().download_file(self.bucket_name, self._key(name), str(destination))
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    raise FileNotFoundError(f"{self.uri(name)} does not exist") from error
                raise

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> None:
        """Upload `data`; with `expected_version` only over that ETag (ABSENT: only if nothing is there)."""
        wanted = (len(data), crc32c_base64(data))
        if expected_version is None:
            head = self._head(name)
            if head is not None and (head["ContentLength"], head.get("Metadata", {}).get(CRC32C_METADATA)) == wanted:
                return
            expected_version = ABSENT if head is None else head["ETag"]
        condition = {"IfNoneMatch": "*"} if expected_version == ABSENT else {"IfMatch": expected_version}
        with _s3_errors(self.uri(name)):
            try:
                s3_client().put_object(
                    Bucket=self.bucket_name,
                    Key=self._key(name),
                    Body=data,
                    Metadata={CRC32C_METADATA: wanted[1]},
                    **condition,
                )
            except _s3_client_error() as error:
                # 412: the precondition failed; 409: a concurrent conditional write to the same key won.
                if _s3_status(error) not in (409, 412):
                    raise
                if self.checksum(name) == wanted:
                    return  # another writer published the same bytes
                raise _conflict(self.uri(name)) from None

    def withdraw(self, name: str) -> None:
        head = self._head(name)
        if head is None:
            return
        with _s3_errors(self.uri(name)):
            try:
                s3_client().delete_object(Bucket=self.bucket_name, Key=self._key(name), IfMatch=head["ETag"])
            except _s3_client_error() as error:
                if _s3_status(error) in (404, 409, 412):
                    logger.info("%s was already removed or replaced by another writer", self.uri(name))
                elif _s3_status(error) == 501:  # a store without conditional deletes
                    s3_client().delete_object(Bucket=self.bucket_name, Key=self._key(name))
                else:
                    raise

    def list(self, prefix: str = "") -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        names = []
        with _s3_errors(self.root):
            pages = (
                s3_client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket_name, Prefix=start + prefix)
            )
            for page in pages:
                names.extend(item["Key"][len(start) :] for item in page.get("Contents", []))
        return sorted(name for name in names if name and not name.rsplit("/", 1)[-1].startswith("."))


def _s3_client_error():
    from botocore.exceptions import ClientError

    return ClientError


def _s3_status(error) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


@contextlib.contextmanager
def _store_errors(uri: str, explain: Callable[[Exception], str | None]) -> Iterator[None]:
    """Turn what `explain` recognises (an unreachable store, missing or refused credentials) into one clear
    StorageError naming the object; anything else passes unchanged."""
    try:
        yield
    except _ClientUnavailableError as error:
        raise StorageError(f"{uri}: {error.reason}") from error
    except StorageError:
        raise
    except Exception as error:
        explanation = explain(error)
        if explanation is None:
            raise
        raise StorageError(f"{uri}: {explanation}") from error


def _explain_s3_error(error: Exception) -> str | None:
    from botocore import exceptions

    endpoint = s3_endpoint() or "AWS S3 (no AWS_ENDPOINT_URL set)"
    if isinstance(error, exceptions.NoCredentialsError):
        return f"no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (endpoint {endpoint})"
    if isinstance(error, exceptions.EndpointConnectionError | exceptions.ConnectTimeoutError):
        return f"cannot reach the S3 endpoint {endpoint}: {error}"
    if isinstance(error, exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            return (
                f"the S3 store at {endpoint} refused the credentials ({code}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            )
        if code == "NoSuchBucket":
            return f"the bucket does not exist at {endpoint}"
    return None


def _explain_gcs_error(error: Exception) -> str | None:
    import requests
    from google.api_core import exceptions
    from google.auth.exceptions import RefreshError, TransportError

    endpoint = gcs_endpoint()
    if isinstance(error, RefreshError | exceptions.Unauthorized | exceptions.Forbidden):
        return (
            f"Cloud Storage at {endpoint} refused the credentials ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}); check GOOGLE_APPLICATION_CREDENTIALS or the service account"
        )
    if isinstance(error, requests.ConnectionError | TransportError | exceptions.RetryError):
        return f"lost the connection to Cloud Storage at {endpoint} ({error})"
    return None


def _s3_errors(uri: str):
    return _store_errors(uri, _explain_s3_error)


def _gcs_errors(uri: str):
    return _store_errors(uri, _explain_gcs_error)


def publisher_for(root: str) -> LocalPublisher | GcsPublisher | S3Publisher:
    """The publisher for a local folder, a gs:// prefix or an s3:// (or KFP minio://) prefix."""
    if is_gcs_uri(root):
        return GcsPublisher(root)
    if is_s3_uri(root):
        return S3Publisher(root)
    return LocalPublisher(root)
