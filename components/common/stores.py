"""The stores' one protocol (`Publisher`: objects under a root, published whole, swapped over a version), and its
local implementation, a folder. gs:// and s3:// are in object_stores.py, the Kubernetes API as a document store in
coordination.py; storage.py picks one for a location.

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

import contextlib
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Protocol

from components.common.filesystem import (
    SCHEME,
    PublishConflictError,
    StorageError,
    atomic_write_bytes,
    crc32c_base64,
)

ABSENT = "absent"  # the version of an object that does not exist
LOCK_NOTICE_SECONDS = 5.0  # a local root's lock held this long is said, with its holder
LOCK_WAIT_SECONDS = 120.0  # and past this, the wait ends in one line naming the holder

logger = logging.getLogger(__name__)


def _holder_state(pid: int) -> str:
    """'stopped' (SIGSTOP, Ctrl-Z, a debugger), 'running', or 'gone', as this machine's /proc tells."""
    try:  # reader: the kernel's one-line status of a process: "pid (name) state ..."
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(state, "running")


@contextlib.contextmanager
def root_lock(root: str):
    """The exclusive lock on `<root>/.publish.lock` that local compare-and-swaps take; its holder (pid and host) is
    written in it. A wait past LOCK_NOTICE_SECONDS is said once, naming the holder and whether it is stopped; past
    LOCK_WAIT_SECONDS it ends in StorageError naming them."""
    Path(root).mkdir(parents=True, exist_ok=True)
    path = Path(root, ".publish.lock")
    with open(path, "a+") as lock:
        started, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                lock.seek(0)
                holder = lock.read(200).strip() or "an unknown process"  # reader: the holder's own line
                pid, _, host = holder.partition(" on ")
                state = _holder_state(int(pid)) if pid.isdigit() and host == socket.gethostname() else "elsewhere"
                if waited >= LOCK_WAIT_SECONDS:
                    raise StorageError(
                        f"{path}: held for {waited:.0f} s by pid {holder} ({state}); nothing was changed: end or "
                        "continue that process (kill -CONT), then run again"
                    ) from None
                if waited >= LOCK_NOTICE_SECONDS and not said:
                    logger.warning("waiting for %s, held by pid %s (%s)", path, holder, state)
                    said = True
                time.sleep(0.1)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()} on {socket.gethostname()}")
        lock.flush()
        yield


class Publisher(Protocol):
    """Objects under one root (a local folder, a gs:// or an s3:// prefix), named by relative paths."""

    root: str

    def uri(self, name: str) -> str: ...
    def read(self, name: str) -> bytes | None: ...
    def read_versioned(self, name: str) -> tuple[bytes | None, str]: ...
    def version(self, name: str) -> str: ...
    def checksum(self, name: str) -> tuple[int, str] | None: ...
    def download(self, name: str, destination: Path) -> None: ...
    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> str:
        """Write `name` (with `expected_version`: only over that version, ABSENT: only if absent); returns the
        version the store answered for what was written, so a caller never reads it back (another writer's
        version could be read in between)."""
        ...

    def withdraw(self, name: str) -> None: ...
    def copy(self, source: str, destination: str, replace: bool = False) -> None:
        """A copy within the store (server-side on gs:// and s3://). Without `replace`, gs:// also refuses a
        destination that exists (a promotion's new version folder); a folder and s3:// replace it either way."""
        ...

    def list(self, prefix: str = "") -> list[str]: ...

    # Documents: what a compare-and-swap decides (a dataset's manifest, a writer lease, a promotion pointer). On a store
    # that honours conditional writes they are objects like any other; on one that does not, a step in a pod keeps
    # them in the Kubernetes API (components/common/coordination.py) and the store holds a copy.
    def read_document(self, name: str) -> tuple[bytes | None, str]: ...
    def swap_document(self, name: str, data: bytes, expected_version: str) -> str: ...
    def withdraw_document(self, name: str, expected_version: str | None = None) -> None:
        """Remove the document; with `expected_version`, only that version of it (another writer's since:
        PublishConflictError, and it stays)."""
        ...


def conflict_error(uri: str) -> PublishConflictError:
    return PublishConflictError(f"{uri} was changed by another writer with different content while publishing")


def content_version(data: bytes | None) -> str:
    return ABSENT if data is None else f"{len(data)}:{crc32c_base64(data)}"


class LocalPublisher:
    """A local folder. Compare-and-swap publishing holds an exclusive lock on `<root>/.publish.lock`."""

    def __init__(self, root: str | Path):
        if SCHEME.match(str(root)):  # a URI of a scheme no publisher serves, not a folder named "http:"
            raise StorageError(f"{root}: not a folder, gs:// or s3:// location")
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
        return data, content_version(data)

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

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> str:
        if expected_version is None:
            atomic_write_bytes(Path(self.root, name), data)  # renaming over identical bytes changes nothing
            return content_version(data)
        with root_lock(self.root):
            current, version = self.read_versioned(name)
            if current == data:
                return version
            if version != expected_version:
                raise conflict_error(self.uri(name))
            atomic_write_bytes(Path(self.root, name), data)
            return content_version(data)

    def withdraw(self, name: str) -> None:
        """Remove an object, and the folders it leaves empty below the root (an object store has no folders)."""
        path = Path(self.root, name)
        path.unlink(missing_ok=True)
        root = Path(self.root)
        for folder in path.parents:
            if folder == root or root not in folder.parents:
                break
            try:
                folder.rmdir()
            except OSError:  # not empty
                break

    def copy(self, source: str, destination: str, replace: bool = False) -> None:
        atomic_write_bytes(Path(self.root, destination), Path(self.root, source).read_bytes())

    def read_document(self, name: str) -> tuple[bytes | None, str]:
        return self.read_versioned(name)

    def swap_document(self, name: str, data: bytes, expected_version: str) -> str:
        return self.publish(name, data, expected_version)

    def withdraw_document(self, name: str, expected_version: str | None = None) -> None:
        if expected_version is None:
            self.withdraw(name)
            return
        with root_lock(self.root):  # as publish compares and swaps
            if self.version(name) not in (expected_version, ABSENT):
                raise conflict_error(self.uri(name))
            self.withdraw(name)

    def list(self, prefix: str = "") -> list[str]:
        root = Path(self.root)
        if not root.exists():
            return []
        names = (path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
        return sorted(name for name in names if name.startswith(prefix) and not Path(name).name.startswith("."))
