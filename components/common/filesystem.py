"""The storage layer's ground floor: locations and local files. Every reader of the project stands on it, and it
imports nothing of the project but `values`.

- locations: the schemes a location may have (`scheme_problem`, the one rule for every parameter and option), object
  store URIs (gs://, s3://, KFP's minio://) and their parts, joined and split;
- the storage layer's errors (a store unreachable, unsafe, a writer that lost a race, a file that is not what it
  should be), so that every floor above raises and catches the same ones;
- local files read within a bound (a FIFO, a device or a link to one refused without blocking), read as lines,
  appended to, written atomically (temporary name, then rename), and the temporaries and scratch folders a killed
  process leaves, found and removed.

The floors above: documents.py (parsing and schemas), the stores (stores.py: the protocol and a local folder;
object_stores.py: gs:// and s3://; coordination.py: the Kubernetes API as a document store), and storage.py (any
location: a publisher for it, its bounded reads).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import google_crc32c

from components.common.values import parse_bool, shown

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


class StoreUnavailableError(StorageError):
    """The store kept answering with a transient error (5xx, SlowDown, throttling, a reset or cut connection, a
    timeout) through every retry: not a setting to fix but a moment to wait out, so its exit code is retryable."""


class UnsafeStoreError(StorageError):
    """The object store does not honour conditional writes, so concurrent writers would go undetected."""


ASSUME_SINGLE_WRITER = "CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER"


def assume_single_writer() -> bool:
    """Whether the user guarantees one writer at a time per location (so a store without conditional writes may be
    used): the environment says so (every stage's --assume-single-writer sets it, for its worker processes too).
    A value that is neither true nor false is an error, not "no": a misspelt yes would otherwise fail later, at the
    store's check, with advice to set what was set."""
    text = os.environ.get(ASSUME_SINGLE_WRITER, "")
    if not text.strip():
        return False
    try:
        return parse_bool(text)
    except argparse.ArgumentTypeError:
        raise StorageError(
            f"{ASSUME_SINGLE_WRITER}: {text!r} is neither true (1, true, yes, on) nor false (0, false, no, off)"
        ) from None


def apply_single_writer_option(enabled: bool) -> None:
    """A stage's --assume-single-writer: for this process and the processes it starts."""
    if enabled:
        os.environ[ASSUME_SINGLE_WRITER] = "1"


class ClientUnavailableError(StorageError):
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


def can_connect(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to host:port opens (refused, unreachable and unresolvable names are False)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def crc32c_base64(data: bytes) -> str:
    """CRC32C as Cloud Storage reports it (base64 of the big-endian 4 bytes)."""
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for messages."""
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISSOCK: "a socket",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")


class FileReadError(ValueError):
    """A file to be read is not a regular file, or larger than it may be (then `size` is what it holds)."""

    def __init__(self, message: str, size: int | None = None):
        super().__init__(message)
        self.size = size


def _open_regular(path: str | Path) -> tuple[int, int]:
    """A descriptor of the regular file at `path`, and its size. A folder is IsADirectoryError naming the path (Python's
    own file object would name descriptor 3), anything else FileReadError; the descriptor is then closed."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        if stat.S_ISDIR(status.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        raise FileReadError(f"{path}: not a regular file ({file_kind(status.st_mode)})")
    return descriptor, status.st_size


def open_regular(path: str | Path) -> IO[bytes]:
    """The regular file at `path` opened to read as a stream (a source larger than memory); a FIFO, a device or a link
    to one refused without blocking on it (FileReadError), a folder IsADirectoryError naming it."""
    descriptor, _size = _open_regular(path)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def sha256_stream(handle: IO[bytes]) -> str:
    """The SHA-256 of what is left in `handle`, read CHUNK_BYTES at a time."""
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The content of a regular file of at most `max_bytes`, never more read: a FIFO, a device or a link to one
    is refused without blocking on it (FileReadError), a missing file is FileNotFoundError."""
    descriptor, size = _open_regular(path)
    with os.fdopen(descriptor, "rb") as handle:
        if size > max_bytes:
            raise FileReadError(f"{path}: {size:,} bytes, more than the {max_bytes:,} it may have", size)
        content = handle.read(size + 1)  # it may have grown since
        while size < len(content) <= max_bytes:  # it grew: read on, within the bound
            more = handle.read(min(1 << 20, max_bytes + 1 - len(content)))
            if not more:
                break
            content += more
    if len(content) > max_bytes:
        raise FileReadError(f"{path}: more than the {max_bytes:,} bytes it may have", len(content))
    return content


def read_tail(path: str | Path, max_bytes: int) -> bytes:
    """The last `max_bytes` of a regular file (a log's last lines), never more read; FileReadError for a FIFO or a
    device, without blocking on it."""
    descriptor, size = _open_regular(path)
    with os.fdopen(descriptor, "rb") as handle:
        handle.seek(max(size - max_bytes, 0))
        return handle.read(max_bytes)


def whole_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """(number, line) of each whole line of a regular file, read as a stream; a last line cut short (a writer
    stopped mid-line) is not a line."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise FileReadError(f"{path}: not a regular file ({file_kind(mode)})")
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                return
            yield number, line


def cut_to_whole_lines(path: str | Path, keep: int | None = None) -> int:
    """Cut a regular file back to its last whole line (or to `keep` bytes); returns the bytes dropped."""
    descriptor = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "r+b") as handle:
        mode, size = os.fstat(descriptor).st_mode, os.fstat(descriptor).st_size
        if not stat.S_ISREG(mode):
            raise FileReadError(f"{path}: not a regular file ({file_kind(mode)})")
        if keep is None:
            keep, end = 0, size
            while end > 0:  # the last newline, read backwards a block at a time
                start = max(end - (1 << 16), 0)
                handle.seek(start)
                found = handle.read(end - start).rfind(b"\n")
                if found >= 0:
                    keep = start + found + 1
                    break
                end = start
        if keep < size:
            handle.truncate(keep)
        return size - keep


def open_for_append(path: str | Path, text: bool = False) -> IO:
    """A regular file (made when absent) opened to append to, never through a link; FileReadError for a folder, a
    FIFO or a device, without blocking on it. Text is UTF-8, a character it cannot hold written escaped."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    descriptor = os.open(path, flags, 0o644)
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise FileReadError(f"{path}: not a regular file ({file_kind(mode)})")
    os.set_blocking(descriptor, True)
    if text:
        return open(descriptor, "a", encoding="utf-8", errors="backslashreplace", buffering=1)
    return open(descriptor, "ab")


# -- temporary files: named after their writer, so that what a killed writer left is found and removed ---------

_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{12}\.tmp$")
STALE_TEMPORARY_SECONDS = 24 * 3600  # a temporary of another host is removed only when this old


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def temporary_path(destination: Path) -> Path:
    """Where to write `destination` before renaming it into place: a hidden name recording host and process."""
    return destination.with_name(f".{destination.name}.{_host()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def process_alive(pid: int) -> bool:
    """Whether a process of this host with that id exists (one of another user counts)."""
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
            stale = not process_alive(int(match["pid"]))
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


@contextlib.contextmanager
def scratch(purpose: str):
    """A scratch directory (`scratch_directory`) for the duration of a `with`: removed at its end, and by the next
    process of this host when its own process was killed before that."""
    folder = scratch_directory(purpose)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale_scratch() -> None:
    """Remove this host's scratch folders whose process no longer runs."""
    host = _host()
    for path in Path(tempfile.gettempdir()).glob(f"{_SCRATCH_PREFIX}*"):
        match = _SCRATCH.match(path.name)
        if match and match["host"] == host and not process_alive(int(match["pid"])) and path.is_dir():
            logger.info("removing %s, left by a killed process", path)
            shutil.rmtree(path, ignore_errors=True)


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
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a failed write() names no file: say which (a full disk, most often)
        raise


# The schemes a location may have: object stores (minio:// is how KFP names its own store's artifacts) and, for a
# source, a download. Any other scheme:// (ftp://, file://, S3://) would otherwise be taken for a local folder whose
# name begins "ftp:" and be read or written there.
STORE_SCHEMES = ("gs", "s3", "minio")
URL_SCHEMES = ("http", "https")
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")  # and Unicode's line and paragraph separators
# Bucket names as the stores define them: S3 (and KFP's minio://) 3-63 of a-z 0-9 . -, a letter or digit at each
# end; Cloud Storage also takes '_', and up to 222 in dotted names of components of at most 63.
_BUCKETS = {
    "s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
}
_BUCKETS["minio"] = _BUCKETS["s3"]
MAX_KEY_PREFIX_BYTES = 768  # of a location's key: the stores take 1,024 in all, and the project's names go under it


def scheme_problem(name: str, value: str, schemes: Sequence[str] = STORE_SCHEMES + URL_SCHEMES) -> str | None:
    """Why `value` (field or parameter `name`) names a location it cannot: a scheme it cannot have; for every
    location with a scheme, a control character (a newline); for an object store's, no bucket or a `..` in its key
    (an object named `..`, not the folder above). None when it may."""
    match = SCHEME.match(value)
    if match is None:
        return None
    scheme = match.group(1)
    if scheme not in schemes:
        return (
            f"{name}: {shown(value)}: {scheme}:// is not a scheme this project reads or writes (a folder, "
            f"{', '.join(scheme + '://' for scheme in schemes)})"
        )
    if CONTROL_CHARACTER.search(value):
        return f"{name}: {shown(value)} holds a control character (a newline, a tab): no location has one"
    authority = value[match.end() :].split("/", 1)[0]
    if scheme in URL_SCHEMES and "@" in authority:
        masked = value[: match.end()] + "***@" + value[match.end() + len(authority.rpartition("@")[0]) + 1 :]
        return (
            f"{name}: {shown(masked)} carries credentials in the URL (user:password@); give a URL without them (a "
            "presigned URL carries its own signature), or copy the data to the store"
        )
    if scheme in STORE_SCHEMES:
        return _store_location_problem(name, value, scheme, value[match.end() :])
    return None


def _store_location_problem(name: str, value: str, scheme: str, rest: str) -> str | None:
    """Why an object store's location (`rest`: after the scheme) names nothing the store can hold, by its rules."""
    bucket, _, key = rest.partition("/")
    if not bucket:
        return f"{name}: {shown(value)} names no bucket: give {scheme}://BUCKET/PATH"
    if not _BUCKETS[scheme].fullmatch(bucket) or ".." in bucket or (scheme != "gs" and len(bucket) > 63):
        return (
            f"{name}: {shown(value)}: {shown(bucket)} is not a {scheme}:// bucket name (3 to 63 lowercase letters, "
            "digits, '.' and '-', a letter or digit at each end)"
        )
    if "?" in rest or "#" in rest:
        return f"{name}: {shown(value)} has a query or fragment ('?', '#'): give the prefix alone"
    segments = key.rstrip("/").split("/") if key else []
    if "" in segments:
        return f"{name}: {shown(value)} has an empty segment ('//'): give the prefix with single slashes"
    if ".." in segments or "." in segments:
        return (
            f"{name}: {shown(value)}: an object store has no folders to step out of or stay in ('..', '.'), so "
            "these would be object names: give the prefix itself"
        )
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_PREFIX_BYTES:
        return (
            f"{name}: {shown(value)}: its key is {len(key.encode('utf-8', 'surrogatepass')):,} bytes; the store's "
            f"keys hold 1,024 in all and the project's names go under it: at most {MAX_KEY_PREFIX_BYTES}"
        )
    return None
