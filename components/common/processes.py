"""The one way the stages start a child process: it dies with the process that started it, however that one ends.

A child started with plain `subprocess` outlives a parent killed by `kill -9` (or by the OOM killer): the evaluate
stage's serving canary went on loading exports left in /tmp, TensorBoard's server kept its port. `start` and `run`
ask Linux to send the child SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), set between fork and exec, so
there is no moment when the child could be orphaned unnoticed. (The training workers have their own supervisor,
components/train/supervisor.py, which does the same and more.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """In the child, before exec: SIGTERM when the parent dies; at once if it is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(143)


def _owned(keywords: dict[str, Any]) -> dict[str, Any]:
    if "preexec_fn" in keywords:
        raise ValueError("processes.start/run set preexec_fn themselves")
    parent = os.getpid()
    return {**keywords, "preexec_fn": lambda: _die_with_parent(parent)}


def start(command: list[str], **keywords: Any) -> subprocess.Popen:
    """subprocess.Popen(command, **keywords), the child ending with this process."""
    return subprocess.Popen(command, **_owned(keywords))


def run(command: list[str], **keywords: Any) -> subprocess.CompletedProcess:
    """subprocess.run(command, **keywords), the child ending with this process."""
    return subprocess.run(command, **_owned(keywords))
