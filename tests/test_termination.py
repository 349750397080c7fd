"""The training's stop handling (components/train/termination.py) survives every signal a process can get, in any
order: stopped and continued (SIGSTOP, SIGCONT: Ctrl-Z and fg, a debugger, a frozen cgroup), it still acts on the
SIGTERM of a preemption, the SIGINT of Ctrl-C and the SIGHUP of a closed terminal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.builders import REPOSITORY

PROGRAM = """
import sys, time, threading
from components.train import termination
termination.block_for_this_process()
watch = termination.Termination().install()
print("ready", flush=True)
deadline = time.monotonic() + 20
while not watch.requested and time.monotonic() < deadline:
    time.sleep(0.02)
alive = any(thread.name == "sigterm-watcher" and thread.is_alive() for thread in threading.enumerate())
print(watch.requested, watch.signal_name, alive, flush=True)
"""


@pytest.mark.parametrize(
    "signals",
    [(signal.SIGSTOP, signal.SIGCONT, signal.SIGTERM),
     (signal.SIGCONT, signal.SIGSTOP, signal.SIGCONT, signal.SIGSTOP, signal.SIGCONT, signal.SIGINT),
     (signal.SIGSTOP, signal.SIGCONT, signal.SIGHUP),
     (signal.SIGTERM,)],
    ids=lambda signals: "-".join(number.name.removeprefix("SIG") for number in signals),
)  # fmt: skip
def test_a_stop_and_continue_leaves_the_stop_handling_alive_for_the_next_signal(signals):
    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        for number in signals:
            process.send_signal(number)
            time.sleep(0.3)  # the watcher waits 0.2 s at a time: each signal meets it waiting
        output, errors = process.communicate(timeout=30)
    finally:
        process.kill()
    assert "Traceback" not in errors, errors
    assert output.split() == ["True", signals[-1].name, "True"]
    assert f"{signals[-1].name} received: stopping" in errors
