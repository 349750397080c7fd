"""A folder or file the stage may not use (permission denied, a read-only file system) and a name that is not
UTF-8, wherever they are raised: by Python (OSError EACCES, EPERM, EROFS; UnicodeEncodeError of a path), by
TensorFlow (an OpError saying "Permission denied" or "Read-only file system"), directly or as the cause of another
error.

Both are a setting to fix, not a bug and not worth a retry: every stage ends with one line naming the path (a
name that is not UTF-8 shown with its undecodable bytes escaped, `\\udcff`) and exits with `exit_codes.BAD_INPUT`.
`check_writable` finds the first before the heavy set-up (the TensorFlow import, the data), where it can.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from components.common.causes import causes

_DENIED = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted", errno.EROFS: "read-only"}
_MESSAGES = {"Permission denied": "permission denied", "Read-only file system": "read-only"}


def shown_path(path: str | os.PathLike | bytes) -> str:
    """A path as a line shows it: undecodable bytes (surrogates, or bytes) escaped, never an encoding error."""
    if isinstance(path, bytes):
        return path.decode("utf-8", "backslashreplace")
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


def describe(error: BaseException) -> str | None:
    """The one line for a path the stage may not use or cannot name; None for any other error."""
    for link in causes(error):
        if isinstance(link, OSError) and link.errno in _DENIED:
            where = link.filename if link.filename is not None else "a file"
            return f"cannot use {shown_path(where)}: {_DENIED[link.errno]}; give a folder this user may write to"
        if isinstance(link, UnicodeError) and isinstance(getattr(link, "object", None), str):
            text = link.object
            if any("\udc80" <= character <= "\udcff" for character in text):
                return f"the name {shown_path(text)} is not UTF-8: rename it (or the folder holding it)"
        message = str(link)
        for marker, reason in _MESSAGES.items():
            if marker in message and "OpError" in "".join(kind.__name__ for kind in type(link).__mro__):
                first = message.splitlines()[0][:300]
                return f"{shown_path(first)} ({reason}); give a folder this user may write to"
    return None


def check_writable(folder: str | os.PathLike, what: str) -> None:
    """`folder` (local) can be written by this user, or made where it is missing: a ValueError naming it otherwise,
    before any heavy set-up. Nothing is left behind (a probe file in the folder, or in its nearest existing parent,
    is removed at once). A remote store is checked by its first write."""
    path = Path(folder)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what}: cannot write to {shown_path(path)} ({shown_path(existing)} is not a folder)")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".writable-", delete=True):
            pass
    except OSError as error:
        reason = _DENIED.get(error.errno, error.strerror or str(error))
        raise ValueError(f"{what}: cannot write to {shown_path(path)} ({reason})") from error
