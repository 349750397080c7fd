"""The local launcher: N worker processes on this machine, each with its own TF_CONFIG on free localhost ports.

Worker output is streamed with a `[worker-i]` prefix. When a worker fails, the others are stopped
(SIGTERM, then SIGKILL after `worker_failure_timeout_seconds`: a worker blocked in a collective cannot
answer SIGTERM) and the launcher exits non-zero, naming the worker that caused it: one stopped (paused) for
longer than that timeout, else the first to exit; a dead or paused peer never becomes a hang.
A SIGTERM to the launcher is passed on to every worker, which then checkpoint and exit with 143.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

from components.common import exit_codes, filesystem
from components.common.config import config_to_dict
from components.train import supervisor
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2


LAUNCHER_PID = "CIFAR10_PIPELINE_LAUNCHER_PID"


def die_with_launcher() -> None:
    """In a worker started by this launcher: receive SIGTERM (checkpoint, exit 143) when the launcher dies, however
    it dies, so no worker goes on writing the model directory without it."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher:
        supervisor.die_with_parent(int(launcher), signal.SIGTERM)


# A training process's resident memory before its data and model: TensorFlow's own (a KFP step that imports it took
# 360 MB, a worker of the demo's ResNet-8 550 MB, 2026-11-28). Processes that cannot have even this are refused.
PROCESS_MEMORY_FLOOR = 512 * 2**20


def available_memory() -> int | None:
    """Bytes this machine can still give a new process, or its cgroup (a pod's, a container's limit), the fewer;
    None where neither can be read."""
    readings = []
    meminfo = _small_file("/proc/meminfo")
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            readings.append(int(line.split()[1]) * 1024)
    for limit_file, used_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        limit, used = _small_file(limit_file), _small_file(used_file)
        if limit and used and limit.strip().isdigit() and used.strip().isdigit():  # v2's "max" is no limit
            readings.append(int(limit) - int(used))  # (v1's none is a number beyond any machine's memory)
    return min(readings) if readings else None


def _small_file(path: str) -> str | None:
    """A few lines the kernel writes (their size says 0: read on to the end, within the bound), or None."""

    try:
        return filesystem.read_regular_file(path, 64 * 1024).decode()
    except (OSError, ValueError):
        return None


def processes_problem(
    processes: int, what: str, available: int | None = None, where: str = "this machine"
) -> str | None:
    """Why this machine cannot hold `processes` training processes at once (`what` names the setting), or None: each
    needs at least PROCESS_MEMORY_FLOOR, and more would have the kernel swap or kill them, the machine with them."""
    available = available_memory() if available is None else available
    if available is None or processes * PROCESS_MEMORY_FLOOR <= available:
        return None
    gigabytes = PROCESS_MEMORY_FLOOR / 2**30
    return (
        f"{what}: {processes} training processes on {where} need at least {processes * gigabytes:.1f} GB "
        f"({gigabytes:.1f} GB each, TensorFlow's own before any data), and it has {available / 2**30:.1f} GB "
        f"available: give at most {max(1, available // PROCESS_MEMORY_FLOOR)}"
    )


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (held open together so that they differ)."""
    sockets = []
    try:
        for _ in range(count):
            handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            handle.bind(("127.0.0.1", 0))
            sockets.append(handle)
        return [handle.getsockname()[1] for handle in sockets]
    finally:
        for handle in sockets:
            handle.close()


def _thread_share(workers: int) -> dict[str, str]:
    """Each worker's share of this machine's cores for TensorFlow's op threads (unless set): N workers each using
    every core fight over them (two ResNet-20 workers on 2 cores: 103 examples/s, 130 with a core each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = {"TF_NUM_INTRAOP_THREADS": str(max(1, cores // workers)), "TF_NUM_INTEROP_THREADS": "2"}
    return {name: os.environ.get(name) or value for name, value in share.items()}


def tf_config(ports: list[int], index: int) -> str:
    return json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]}, "task": {"type": "worker", "index": index}}
    )


def worker_command(config: TrainConfig) -> list[str]:
    """Each worker runs the train CLI with the exact resolved configuration, as a worker."""
    worker_config = config_to_dict(replace(config, launcher="worker"))
    return [sys.executable, "-m", "components.train", "--config", json.dumps(worker_config)]


def _stream(process: subprocess.Popen, prefix: str) -> None:
    for line in process.stdout:
        sys.stderr.write(f"[{prefix}] {line}")
    sys.stderr.flush()


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


def launch_local(config: TrainConfig) -> int:
    """Run `config.workers` worker processes to completion; returns the exit code for the launcher."""
    ports = free_ports(config.workers)
    command = worker_command(config)
    processes: list[subprocess.Popen] = []
    streams = []
    for index in range(config.workers):
        environment = {
            **os.environ,
            "TF_CONFIG": tf_config(ports, index),
            "PYTHONUNBUFFERED": "1",
            LAUNCHER_PID: str(os.getpid()),  # the worker ends when this process dies, even by kill -9
            **_thread_share(config.workers),
        }
        process = subprocess.Popen(
            command,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher, which decides
        )
        processes.append(process)
        logger.info("started worker-%d (pid %d) on 127.0.0.1:%d", index, process.pid, ports[index])
        thread = threading.Thread(target=_stream, args=(process, f"worker-{index}"), daemon=True)
        thread.start()
        streams.append(thread)

    def forward(signal_number, _frame):
        logger.warning("received %s: passing it on to the workers", signal.Signals(signal_number).name)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = _wait(processes, config.worker_failure_timeout_seconds)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for thread in streams:
            thread.join(timeout=5)
    return code


def _wait(processes: list[subprocess.Popen], failure_timeout: float) -> int:
    """Until every worker has ended well, or one has failed or stayed stopped: the cause is the worker that stopped
    (paused, its peers blocked on it), else the first to exit, never a peer that only failed because of it."""
    exit_order: list[int] = []  # worker indexes in the order their exits were seen
    stopped_since: dict[int, float] = {}
    while True:
        for index, process in enumerate(processes):
            if index not in exit_order and process.poll() is not None:
                exit_order.append(index)
        now = time.monotonic()
        for index, process in enumerate(processes):
            if process.poll() is None and process_tree_stopped(process.pid):
                stopped_since.setdefault(index, now)
            else:
                stopped_since.pop(index, None)
        failed = [index for index in exit_order if processes[index].returncode != 0]
        paused = sorted(index for index, since in stopped_since.items() if failed or now - since > failure_timeout)
        if paused:
            index = paused[0]
            logger.error(
                "worker-%d (pid %d) is stopped (paused by SIGSTOP or a debugger): the others cannot go on without it%s;"
                " stopping every worker",
                index, processes[index].pid,
                f" (worker-{failed[0]} {_describe_exit(processes[failed[0]].returncode)} meanwhile)" if failed else "",
            )  # fmt: skip
            _stop(processes, failure_timeout)
            return exit_codes.FAILED
        if failed:
            index = failed[0]
            code = processes[index].returncode
            if code == exit_codes.PREEMPTED:  # the others checkpoint at the same agreed step: let them finish
                logger.warning("worker-%d was preempted (exit %d); waiting for the others to checkpoint", index, code)
                _stop(processes, failure_timeout)
                return exit_codes.PREEMPTED
            logger.error("worker-%d %s; stopping the other workers", index, _describe_exit(code))
            _stop(processes, failure_timeout)
            return supervisor.exit_code_of(code)
        if len(exit_order) == len(processes):
            logger.info("all %d workers finished", len(processes))
            return 0
        time.sleep(POLL_SECONDS)


def process_tree_stopped(pid: int) -> bool:
    """Whether `pid` or any process below it is stopped (state T: SIGSTOP, Ctrl-Z; t: a debugger)."""
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as handle:  # reader: the kernel's /proc lines of one process
                state = handle.read().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("T", "t"):
            return True
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            # reader: the kernel's /proc lines of one process
            with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task}/children") as handle:
                pending.extend(int(child) for child in handle.read().split())
    return False


def _stop(processes: list[subprocess.Popen], timeout: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once it runs
    deadline = time.monotonic() + timeout
    for process in processes:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            logger.error("worker pid %d did not stop within %.0f s: killing it", process.pid, timeout)
            process.kill()
            process.wait()
