"""One writer per model directory, for as long as that writer lives, tied to the directory itself.

A local folder (or a remote directory's local mirror) is claimed by two locks the kernel holds for the process and
drops when it ends, however it ends, so a claim left by a dead writer is simply taken over:

- an exclusive `flock` on the directory itself (its inode), which a deleted or replaced lock file cannot undo and a
  second path to the same folder (a symlink, a mount) cannot avoid;
- a lock on the directory's path, an abstract Unix socket named after it (Linux; one per network namespace), so a
  second run cannot start in a new folder created where the writer's folder was moved away from.

The writer checks before each save that the folder at its path is still the one it holds (`check`), and stops when
it is not, without writing there. `.writer.lock` in the folder only says who holds the claim, for messages.

A gs:// or s3:// model directory is also claimed across machines, by a lease object in the store (`WriterLease`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

from components.common import documents, filesystem, storage

logger = logging.getLogger(__name__)

MAX_LOCK_BYTES = 4096  # a holder's name and token
WRITER_LOCK = ".writer.lock"  # who holds the claim (informational: the locks are the directory's and the path's)
ONE_WRITER = "a model directory has one writer at a time (wait for it to end, stop it, or give another --model-dir)"


class Folder:
    """What a claimed folder is, for messages: its setting's name and the one-writer rule in words."""

    def __init__(self, field: str = "model_dir", rule: str = ONE_WRITER):
        self.field, self.rule = field, rule


MODEL_DIRECTORY = Folder()


class WriterClaimError(RuntimeError):
    """The model directory has another writer, or this writer's directory was moved or replaced."""


def holder_description() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"


class DirectoryClaim:
    """This process's claim on a local folder as its one writer (see the module's description)."""

    def __init__(self, path: Path, uri: str, folder: Folder = MODEL_DIRECTORY):
        self.path = Path(os.path.abspath(path))
        self.uri = uri
        self.folder = folder
        digest = hashlib.sha256(os.path.realpath(self.path).encode()).hexdigest()
        self._path_lock_name = f"\0cifar10-pipeline/model-dir/{digest}".encode()
        self._descriptor: int | None = None
        self._path_lock: socket.socket | None = None

    def acquire(self) -> None:
        descriptor = os.open(
            self.path, os.O_RDONLY | os.O_DIRECTORY
        )  # reader: a folder's descriptor, for its lock only
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            holder = self._recorded_holder()
            raise WriterClaimError(
                f"{self.folder.field}: {self.uri} is being written by {holder}; {self.folder.rule}"
            ) from None
        self._descriptor = descriptor
        try:
            self._path_lock = self._lock_path()
            filesystem.atomic_write_bytes(self.path / WRITER_LOCK, (holder_description() + "\n").encode())
        except BaseException:
            self.release()
            raise

    def _lock_path(self) -> socket.socket | None:
        name = self._path_lock_name
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(name)
        except OSError as error:
            lock.close()
            if error.errno != errno.EADDRINUSE:
                logger.warning("cannot lock the path %s here (%s): only the folder is locked", self.path, error)
                return None
            raise WriterClaimError(
                f"{self.folder.field}: {self.uri} is being written by {_path_lock_holder(name)}, which holds this path "
                f"although the folder there was moved or replaced while it runs; {self.folder.rule}"
            ) from None
        lock.listen(8)
        return lock

    def _recorded_holder(self) -> str:
        """Who holds the folder: as its `.writer.lock` says, else (the file was deleted) as the path lock's owner."""
        try:
            recorded = filesystem.read_regular_file(self.path / WRITER_LOCK, MAX_LOCK_BYTES).decode().strip()
        except (OSError, ValueError):
            recorded = ""
        return recorded or _path_lock_holder(self._path_lock_name)

    def check(self) -> None:
        """Before a save: the folder at this path must still be the one this writer holds."""
        if self._descriptor is None:
            return
        held = os.fstat(self._descriptor)
        try:
            present = os.stat(self.path)
        except FileNotFoundError:
            present = None
        if present is not None and (present.st_dev, present.st_ino) == (held.st_dev, held.st_ino):
            return
        try:
            moved_to = os.readlink(f"/proc/self/fd/{self._descriptor}")
        except OSError:
            moved_to = "an unknown place"
        happened = "was removed" if present is None else "was replaced by another folder"
        raise WriterClaimError(
            f"{self.folder.field}: {self.uri} {happened} while this run wrote it (the folder this run holds is now at "
            f"{moved_to}); stopping without writing there"
        )

    def release(self) -> None:
        if self._path_lock is not None:
            self._path_lock.close()
            self._path_lock = None
        if self._descriptor is not None:
            os.close(self._descriptor)  # drops the flock
            self._descriptor = None


def _path_lock_holder(name: bytes) -> str:
    """The process that holds a path lock, from the kernel's credentials of its listening socket."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        probe.connect(name)
        pid, _uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return f"pid {pid} on {socket.gethostname()}"
    return "another process on this machine"


# -- the writer lease of a remote model directory ------------------------------------------------------------
# One writer at a time for a gs:// or s3:// model directory, across machines: a lease object in the store, by the
# two rules of client-go's leader election:
# - a newcomer never acts on the record's timestamps (another machine's clock): it takes the lease over only after
#   it has watched the record unchanged for `LEASE_SECONDS` on its own monotonic clock; a change means the holder is
#   alive, and the newcomer fails naming it. A record that looks old on arrival is watched like any other.
# - the holder gives up first: it stops writing once it has not renewed for `renew_deadline()`, `MARGIN` of the
#   lease less than the lease (client-go refuses LeaseDuration <= RenewDeadline), checked before each file it
#   uploads, so no upload starts after the moment a newcomer may take over.
# The lease (`.writer-lease.json`: holder, a token, when it was last renewed, for people to read) is created with
# create-if-absent and renewed every `RENEW_SECONDS` with a compare-and-swap on its version, by a thread, while the
# writer lives; it is removed when the writer ends normally or by SIGTERM, only over the version it last wrote. It
# is a document (`swap_document`): on a store without conditional writes, in a pod, a Kubernetes Lease
# (components/common/coordination.py).

WRITER_LEASE = ".writer-lease.json"
LEASE_SECONDS = 90.0  # a lease seen unchanged this long (on the newcomer's own clock) belongs to a dead writer
MARGIN = 1 / 3  # of the lease: the holder's own deadline comes this much earlier
RENEW_SECONDS = 20.0
POLL_SECONDS = 2.0


def holder_deadline(lease_seconds: float) -> float:
    """How long a holder of a lease of `lease_seconds` may go without a renewal before it stops: `MARGIN` of the
    lease before anyone may take it over."""
    return lease_seconds * (1 - MARGIN)


def renew_deadline() -> float:
    """The writer lease's holder deadline."""
    return holder_deadline(LEASE_SECONDS)


LEASE_SCHEMA = documents.Fields(
    {"renewed_at": documents.Number("[0, inf)"), "token": documents.Text(max_length=64)},
    required=("renewed_at", "token"),
)


def _parse(content: bytes | None, uri: str) -> dict | None:
    """The lease in `content`, read as every document is; a damaged one counts as none (its holder, if alive,
    finds its lease gone at the next renewal and stops writing)."""
    if not content:
        return None
    try:
        return documents.parse(content, uri, LEASE_SCHEMA, "writer lease")
    except documents.DocumentError as error:
        logger.warning("%s; it counts as no lease", error)
        return None


class WriterLease:
    def __init__(self, uri: str, holder: str, folder: Folder = MODEL_DIRECTORY):
        self.uri = uri
        self.folder = folder
        self.holder = holder
        self.token = uuid.uuid4().hex
        self.lost = False
        self._publisher = storage.publisher_for(uri)
        self._version: str | None = None
        self._renewed = time.monotonic()  # the last renewal that went through (this process's clock)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _record(self) -> bytes:
        return json.dumps({"holder": self.holder, "token": self.token, "renewed_at": time.time()}).encode()

    def acquire(self) -> None:
        """Take the lease, waiting out one that nobody renews (watched unchanged for LEASE_SECONDS on this clock);
        WriterClaimError when its holder is alive (the record changed while watched)."""
        watched: tuple[str, float] | None = None  # (version seen, when first seen, on this process's clock)
        while True:
            content, version = self._publisher.read_document(WRITER_LEASE)
            lease = _parse(content, self._publisher.uri(WRITER_LEASE))
            if content is not None and lease is not None and lease["token"] != self.token:
                if watched is not None and watched[0] != version:
                    raise WriterClaimError(
                        f"{self.folder.field}: {self.uri} is being written by {lease.get('holder', 'another writer')} "
                        f"(it renewed its lease while this one watched); {self.folder.rule}"
                    )
                if watched is None:
                    watched = (version, time.monotonic())
                    logger.warning(
                        "%s has a writer lease of %s: watching up to %.0f s whether it is renewed (its holder is "
                        "alive) or not (taken over)", self.uri, lease.get("holder"), LEASE_SECONDS,
                    )  # fmt: skip
                if time.monotonic() - watched[1] < LEASE_SECONDS:
                    time.sleep(POLL_SECONDS)
                    continue
                logger.warning("taking over the writer lease of %s (unchanged for the %.0f s this writer watched it)",
                               lease.get("holder"), LEASE_SECONDS)  # fmt: skip
            try:
                self._version = self._publisher.swap_document(WRITER_LEASE, self._record(), version)
            except filesystem.PublishConflictError:
                continue  # another writer moved first: look again
            self._renewed = time.monotonic()
            break
        self._renewer = threading.Thread(target=self._renew, name="writer-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self._version = self._publisher.swap_document(WRITER_LEASE, self._record(), self._version)
                self._renewed = time.monotonic()
            except filesystem.PublishConflictError:
                self.lost = True
                try:
                    content = self._publisher.read_document(WRITER_LEASE)[0]
                except Exception:  # what happened cannot be seen: say only what is known
                    content = b"?"
                if content is None:
                    logger.error("%s: this model directory's writer lease was removed by someone else (nobody holds "
                                 "it now); this writer stops at its next save", self.uri)  # fmt: skip
                else:
                    logger.error("%s: another writer took over this model directory's lease", self.uri)
                return
            except Exception as error:  # a store that is briefly unreachable: try again at the next renewal
                logger.warning("%s: could not renew the writer lease (%s)", self.uri, error)

    def check(self) -> None:
        if self.lost:
            raise WriterClaimError(f"{self.folder.field}: {self.uri}: another writer took over; this one stops")
        silent = time.monotonic() - self._renewed
        if silent > renew_deadline():  # before anyone may take it over: the holder fences itself
            raise WriterClaimError(
                f"{self.folder.field}: {self.uri}: this writer could not renew its lease for {silent:.0f} s (the store "
                f"or the Kubernetes API did not answer); a newcomer may take it over {LEASE_SECONDS:.0f} s after the "
                "last renewal, so this one stops now (a retry resumes)"
            )

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.lost or self._version is None:
            return
        content, version = self._publisher.read_document(WRITER_LEASE)
        lease = _parse(content, self._publisher.uri(WRITER_LEASE))
        if lease is not None and lease["token"] == self.token:
            try:  # over the version read: a lease another writer took over meanwhile is theirs, not removed
                self._publisher.withdraw_document(WRITER_LEASE, version)
            except filesystem.PublishConflictError:
                logger.info("%s: the writer lease changed hands while being released; left to its holder", self.uri)
        self._version = None
