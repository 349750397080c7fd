"""Process-level memory tuning for stages that churn through large buffers.

Converting CIFAR-10 allocates and frees buffers of 30-270 MB (decompressed archive, pickled batches,
their decoded strings). glibc serves each with fresh pages from mmap and returns them on free, so the
next one page-faults again: on a 2-core VM that was as much system time as the conversion's own work.
Keeping freed memory in the heap lets the next buffer reuse already-mapped pages.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def reuse_freed_memory() -> bool:
    """Ask glibc's malloc to keep large freed blocks for reuse; False (and no change) elsewhere.

    Affects the whole process: call it from a stage's entry point, not from library code.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        applied = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    except (OSError, AttributeError):
        applied = False
    logger.debug("malloc keeps freed memory for reuse: %s", applied)
    return applied
