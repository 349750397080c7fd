"""Out of disk space (or quota), wherever it is raised: by Python (OSError ENOSPC, EDQUOT) or by TensorFlow (an
OpError whose message ends in "No space left on device"), directly or as the cause of another error.

It is a condition an operator fixes and retries, not a bad input and not a bug: every stage ends with one line
naming where, after removing what it had half-written, and exits with `exit_codes.NO_SPACE`, which is retried.
"""

from __future__ import annotations

import errno
import re

from components.common.causes import causes

_MESSAGES = ("No space left on device", "Disk quota exceeded")
_PATH = re.compile(r"/[^\s;:'\",\[\]]+")


def out_of_space(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is a full disk or quota."""
    return any(
        (isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT))
        or any(message in str(link) for message in _MESSAGES)
        for link in causes(error)
    )


def where(error: BaseException) -> str:
    """The file the full disk was found writing, as the error names it, or "a file"."""
    for link in causes(error):
        if isinstance(link, OSError) and link.filename:
            return str(link.filename)
        text = str(link)
        positions = [position for message in _MESSAGES if (position := text.find(message)) >= 0]
        paths = _PATH.findall(text[: min(positions)]) if positions else []
        if paths:  # the last path before the message: TensorFlow's "<file>; No space...", shutil's (src, dst, why)
            return paths[-1]
    return "a file"


def describe(error: BaseException) -> str:
    return (
        f"out of disk space writing {where(error)}: nothing half-written was kept; free space there (or give the step "
        "a larger volume) and run again"
    )
