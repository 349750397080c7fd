"""The files the project writes for a person: predictions, reports, summaries. One owner, so that each asks what is
there before it writes.

- A destination must be a regular file or nothing: a folder, a FIFO, a device or a socket is refused without
  blocking on it, and so is a link (a link would send the write elsewhere), and a path that is one of the job's own
  inputs or another of its outputs (a report over the predictions it summarizes).
- A file a job continues (JSON Lines a stopped job appends to) carries a record beside it, `<file>.job.json`: which
  job wrote it (its inputs, model and options). A file without that record was not written by such a job and is
  refused, as is one of another job: never emptied, never appended to, with one line saying what differs and what to
  do. One writer at a time: the record is locked while a job writes, and a second job is refused naming the first.
- Text files are replaced whole (written beside, then renamed): a reader never sees half a report. Any name can
  appear in them: text that is not UTF-8 (a file name's bytes) is written escaped, never a failed write.
- A failure to write names the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from components.common import documents, filesystem, storage
from components.common.out_of_space import out_of_space

RECORD_SUFFIX = ".job.json"
MAX_RECORD_BYTES = 1 << 20


class OutputError(ValueError):
    """A destination the job may not write: one line naming the file and what to do (exit 2)."""


def _same_file(first: Path, second: Path) -> bool:
    return os.path.abspath(first) == os.path.abspath(second) or (
        first.exists() and second.exists() and os.path.samefile(first, second)
    )


def check_destination(path: str | Path, what: str, others: Iterable[str | Path] = ()) -> Path:
    """`path` may be written as the job's `what`: nothing there, or a regular file (not a link); not one of `others`
    (the job's inputs and its other outputs), nor inside a folder among them."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise OutputError(f"{path}: the {what} cannot be written there ({error.strerror})") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise OutputError(f"{path}: a link; give the {what} a path of its own (a link would send it elsewhere)")
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError(f"{path}: {filesystem.file_kind(mode)}, not a file; give the {what} a file's path")
    for other in others:
        other_text = str(other)
        if not other_text or filesystem.is_remote(other_text):
            continue
        other = Path(other_text)
        inside = other.is_dir() and os.path.abspath(path).startswith(os.path.abspath(other).rstrip("/") + "/")
        if _same_file(path, other) or inside:
            raise OutputError(f"{path}: the {what} would overwrite {other} (one of this job's own files); give it "
                              "another path")  # fmt: skip
    if not path.parent.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(f"{path.parent}: cannot make the {what}'s folder ({error.strerror})") from None
    return path


def write_text(path: str | Path, text: str, what: str, others: Iterable[str | Path] = ()) -> Path:
    """Replace `path` with `text` whole (beside, then renamed); characters UTF-8 cannot hold (a file name's bytes
    read as surrogates) are written as backslash escapes."""
    path = check_destination(path, what, others)
    try:
        filesystem.atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))
    except OSError as error:
        if out_of_space(error):
            raise  # a condition an operator fixes and retries (exit_codes.NO_SPACE), not a setting
        raise OutputError(f"{path}: the {what} could not be written ({error.strerror})") from None
    return path


def write_json(path: str | Path, document: Any, what: str, others: Iterable[str | Path] = ()) -> Path:
    return write_text(path, json.dumps(document, indent=2) + "\n", what, others)


def printable(text: str) -> str:
    """A name as a person reads it: bytes that are not UTF-8 (surrogates) shown as \\xNN."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="backslashreplace")


# -- a file a job continues ----------------------------------------------------------------------------------------

_RECORD_SCHEMA = documents.Fields(
    {"job": documents.Fields(), "kind": documents.Text(max_length=256), "writer": documents.Fields()},
    required=("job", "kind"),
)


def record_path(path: str | Path) -> Path:
    return Path(str(path) + RECORD_SUFFIX)


def _differences(mine: dict, theirs: dict) -> list[str]:
    return [
        f"{name} {json.dumps(theirs.get(name))} (now {json.dumps(mine.get(name))})"
        for name in sorted(set(mine) | set(theirs))
        if mine.get(name) != theirs.get(name)
    ]


@contextlib.contextmanager
def continued_file(path: str | Path, kind: str, job: dict, others: Iterable[str | Path] = ()) -> Iterator[bool]:
    """Hold `path` for this job while the block writes it; yields whether it continues what the same job wrote.

    The file must not exist, or carry a record of the same `kind` and `job` (a stopped job continued); otherwise it
    is refused in one line. A second job on the same file while this one holds it is refused, naming this one."""
    path = check_destination(path, kind, others)
    record = record_path(path)
    check_destination(record, f"{kind}'s record", others)
    exists = path.exists()
    if exists and not record.exists():
        raise OutputError(
            f"{path} exists and was not written by a {kind} job (it has no {record.name}): give another path, or "
            "remove it to write there"
        )
    try:
        descriptor = os.open(record, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as error:  # a read-only or pseudo file system, no permission, no space
        raise OutputError(
            f"{path}: the {kind} cannot be written there ({error.strerror} creating {record.name}); give a path in a "
            "folder this user can write"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(record).get("writer", {})
            raise OutputError(
                f"{path} is being written by another {kind} job (pid {holder.get('pid', '?')} on "
                f"{holder.get('host', '?')}); wait for it, or give another path"
            ) from None
        if exists:
            found = _read_record(record)
            if found.get("kind") != kind or found.get("job") != job:
                differ = _differences(job, found.get("job", {})) if found.get("kind") == kind else []
                said = "; ".join(differ) if differ else f"a {found.get('kind', 'another')} job"
                raise OutputError(
                    f"{path} holds the output of another {kind} job ({said}): give another path, or remove it (and "
                    f"{record.name}) to start over"
                )
        writer = {"pid": os.getpid(), "host": socket.gethostname()}
        content = json.dumps({"kind": kind, "job": job, "writer": writer}, indent=2, sort_keys=True).encode()
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, content, 0)
        os.fsync(descriptor)
        yield exists
    finally:
        os.close(descriptor)  # the lock goes with it


def _read_record(record: Path) -> dict:
    try:
        return storage.document(record, _RECORD_SCHEMA, "output record", max_bytes=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return {}
    except documents.DocumentError as error:
        raise OutputError(f"{error}; remove {record} and its output to start over") from None
