"""The one owner of the processes a local run starts: kfp.local's steps, processes or containers, live and die with
`local-run`.

kfp.local starts each step as `sh -c '... python3 -m kfp.dsl.executor_main ...'` with plain `subprocess.Popen`:
nothing ties the step to the process that started it, so after a SIGTERM, a closed terminal or `kill -9` of
`local-run`, a training step (and its workers) went on for minutes, or to the end, unwatched, holding the model
directory's writer lock. Here every step starts in a process group of its own, and:

- `local-run` gets SIGINT (Ctrl-C) or SIGTERM: it passes SIGTERM to every step's group (training saves a
  checkpoint at a step every worker agrees on and exits 143), keeps reading their output while they end, and
  kills what is left after `STOP_GRACE_SECONDS`; the run is then reported as interrupted, from the checkpoints
  the workers left. A second signal kills the steps at once.
- `local-run` dies however it dies (`kill -9` included): a small reaper process, started first and holding only a
  pipe from `local-run`, sees the pipe close and does the same: SIGTERM to every step's group, then SIGKILL after
  the grace period.

With RUNNER=docker each step is a container, which the engine, not `local-run`, would keep running: here each is
started, stopped (SIGTERM to every process in it but its PID 1, the step's `sh -c`, which as PID 1 neither dies of
it nor passes it on; SIGKILL after the grace); each carries the run's owner label, by which the reaper finds and
removes them (one whose creation was under way when local-run died too); and its exit code is read before it is
removed.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from typing import Any

logger = logging.getLogger("pipeline")

STOP_GRACE_SECONDS = 300.0  # how long a stopped step may take to save its checkpoint and end
DONE = b"done\n"
OWNER_LABEL = "cifar10-pipeline.local-run"  # on every step container: the local-run that owns it
LATE_CONTAINER_SECONDS = 60.0  # how long the reaper watches for a container whose creation was under way
START_SECONDS = 600.0  # a container's start copies its image on vfs storage: over a minute for the GPU image
STEP_NOT_STARTED = 1  # the exit code of a step whose container the engine did not start
DRAIN_SECONDS = 10.0  # how long a step's output may go on after the step exited
REMOVE_SECONDS = 120.0  # how long a container's removal may take (on vfs, a GPU image's copy: about 40 s)
ENDED = ("exited", "dead", "stopped")  # a container's states once it has ended ("stopped": podman 4.3's Docker API)
RUNNING = ("running", "restarting", "paused")


class IndentedPrint:
    """kfp.local's `indented_print`, safe on threads. kfp's swaps `builtins.print` for an indenting one while a step
    runs and back after; kfp 2.17 runs a ParallelFor's steps on threads, whose swaps interleave (a step ends while
    another runs: the second put back the first's indenting print), so the indenting print stayed for the rest of the
    process. This one swaps once for all the steps running, back when the last ends, and indents the lines of the
    threads inside a step only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._original = builtins.print
        self._spaces = threading.local()

    @contextlib.contextmanager
    def __call__(self, num_spaces: int = 4):
        with self._lock:
            if not self._running:
                self._original, builtins.print = builtins.print, self._print
            self._running += 1
        outer = getattr(self._spaces, "count", 0)
        self._spaces.count = outer + num_spaces
        try:
            yield
        finally:
            self._spaces.count = outer
            with self._lock:
                self._running -= 1
                if not self._running:
                    builtins.print = self._original

    def _print(self, *values, **options):
        spaces = getattr(self._spaces, "count", 0)
        if spaces:
            self._original(" " * spaces, end="", file=options.get("file"))
        return self._original(*values, **options)


class StepProcesses:
    """While `supervised()`: kfp.local's step processes, their groups, and how the run was stopped (if it was)."""

    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS):
        self.grace_seconds = grace_seconds
        self.stopped_by: int | None = None  # the signal that stopped the run
        self._groups: set[int] = set()
        self._containers: dict[str, Any] = {}  # the running steps' containers (RUNNER=docker), by ID
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"  # labels this run's containers
        self._owner_told = False
        self.exit_codes: list[int] = []  # of the steps that ended, in the order they ended
        self._lock = threading.Lock()
        self._reaper: subprocess.Popen | None = None

    # -- starting steps ----------------------------------------------------------------------------------------

    def _popen_class(self):
        owner = self

        class StepPopen(subprocess.Popen):
            def __init__(self, *arguments, **keywords):
                keywords["start_new_session"] = True  # a group of its own: stopped as a whole
                super().__init__(*arguments, **keywords)
                owner._started(self.pid)

            def wait(self, timeout=None):
                try:
                    return super().wait(timeout)
                finally:
                    if self.returncode is not None:
                        owner._ended(self.pid, self.returncode)

        return StepPopen

    def _started(self, pid: int) -> None:
        with self._lock:
            self._groups.add(pid)
            stopped = self.stopped_by is not None
        self._tell_reaper(f"{pid}\n")
        if stopped:  # started after the run was stopped (an exit handler): it ends too
            _signal_group(pid, signal.SIGTERM)

    def _tell_reaper(self, line: str) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            with contextlib.suppress(OSError):
                self._reaper.stdin.write(line.encode())
                self._reaper.stdin.flush()

    def run_container(self, client, image: str, command: list[str], volumes: dict, **run_arguments) -> int:
        """kfp.local's `run_docker_container` (it starts every RUNNER=docker step through it), owned by this run.

        Also, the exit code is read before the container is removed: kfp 2.17 starts each step's container with
        auto_remove=True and then asks for its exit code; when the container is already gone, Docker answers 404,
        which kfp takes for success (a failed step would pass), and podman's Docker API 500, which fails the run
        even when the step succeeded. It is read from the container's state, not by `wait` (`follow_until_exit`)."""
        from kfp.local.docker_task_handler import add_latest_tag_if_not_present

        image = add_latest_tag_if_not_present(image=image)
        client.api.timeout = max(client.api.timeout or 0, START_SECONDS)
        if not self._owner_told:  # before the first container is asked for: one may be made after local-run died
            self._owner_told = True
            self._tell_reaper(f"containers {self.owner}\n")
        labels = {**(run_arguments.pop("labels", None) or {}), OWNER_LABEL: self.owner}
        try:
            if not any(image in known.tags + known.attrs.get("RepoDigests", []) for known in client.images.list()):
                logger.info("pulling %s", image)
                client.images.pull(image)
            container = client.containers.run(
                image=image,
                command=command,
                detach=True,
                stdout=True,
                stderr=True,
                volumes=volumes,
                labels=labels,
                **run_arguments,
            )
        except _docker_errors() as error:
            print(f"the step's container could not be started: {_one_line(error)}", flush=True)
            with self._lock:
                self.exit_codes.append(STEP_NOT_STARTED)
            return STEP_NOT_STARTED
        with self._lock:
            self._containers[container.id] = container
            stopped = self.stopped_by is not None
        if stopped:
            stop_container(container)
        try:
            exit_code = follow_until_exit(container)
        finally:
            with self._lock:
                self._containers.pop(container.id, None)
            remove_container(container)
        with self._lock:
            self.exit_codes.append(exit_code)
        return exit_code

    def _ended(self, pid: int, exit_code: int) -> None:
        with self._lock:
            if pid in self._groups:
                self.exit_codes.append(exit_code)
            self._groups.discard(pid)

    def failure_exit_code(self) -> int:
        """The run's exit code after a step failed: a step's bad input (2), full disk (144) or failing store (145)
        is the run's, so that a script tells a setting to fix from a failure; anything else is 1."""
        from components.common import exit_codes

        for code in self.exit_codes:
            if code in (exit_codes.BAD_INPUT, exit_codes.NO_SPACE, exit_codes.STORE_UNAVAILABLE):
                return code
        return exit_codes.FAILED

    # -- stopping ----------------------------------------------------------------------------------------------

    def _on_signal(self, signal_number: int, _frame) -> None:
        with self._lock:
            first = self.stopped_by is None
            self.stopped_by = self.stopped_by or signal_number
        if not first:
            logger.warning("stopping at once (a second %s)", signal.Signals(signal_number).name)
            self._signal_steps(signal.SIGKILL)
            return
        logger.warning(
            "%s: stopping the run; training saves a checkpoint first (at most %.0f s; again to stop at once)",
            signal.Signals(signal_number).name,
            self.grace_seconds,
        )
        self._signal_steps(signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, name="step-grace", daemon=True).start()

    def _signal_steps(self, signal_number: int) -> None:
        """SIGTERM or SIGKILL to every running step, a process group or a container. (Container calls are made
        outside the signal handler's frame: they are HTTP requests, which must not run inside a handler that may
        have interrupted another request on the same connection pool.)"""
        with self._lock:
            groups, containers = sorted(self._groups), list(self._containers.values())
        for group in groups:
            _signal_group(group, signal_number)
        if containers:
            action = stop_container if signal_number == signal.SIGTERM else kill_container
            for container in containers:
                threading.Thread(target=action, args=(container,), name="step-container-signal", daemon=True).start()

    def _running(self) -> bool:
        with self._lock:
            return bool(self._groups or self._containers)

    def _kill_after_grace(self) -> None:
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline:
            if not self._running():
                return
            time.sleep(0.5)
        if self._running():
            logger.warning("steps still running %.0f s after they were stopped: killing them", self.grace_seconds)
            self._signal_steps(signal.SIGKILL)

    # -- the context ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def supervised(self):
        """kfp.local's runners start their steps through this owner (the subprocess runner's processes, the Docker
        runner's containers); SIGINT and SIGTERM stop them."""
        from kfp.local import docker_task_handler, logging_utils, subprocess_task_handler

        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "pipeline.step_processes", str(self.grace_seconds)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # not stopped with the terminal's group: it outlives local-run on purpose
        )
        original_module = subprocess_task_handler.subprocess
        subprocess_task_handler.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": self._popen_class()})
        original_container_start = docker_task_handler.run_docker_container
        docker_task_handler.run_docker_container = self.run_container
        original_indented_print = logging_utils.indented_print
        logging_utils.indented_print = IndentedPrint()
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            # A signal this process was started ignoring (SIGINT of a background job, nohup's SIGHUP) stays ignored.
            handlers = {
                number: signal.signal(number, self._on_signal)
                for number in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(number) is not signal.SIG_IGN
            }
        try:
            yield self
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
            subprocess_task_handler.subprocess = original_module
            docker_task_handler.run_docker_container = original_container_start
            logging_utils.indented_print = original_indented_print
            self._close_reaper()

    def _close_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is None or reaper.stdin is None:
            return
        with contextlib.suppress(OSError):
            reaper.stdin.write(DONE)
            reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=10)


def _signal_group(group: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal_number)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _docker_errors() -> tuple[type[BaseException], ...]:
    """What the Docker SDK raises for a container that is gone or an engine that does not answer."""
    import docker.errors
    import requests.exceptions

    return docker.errors.DockerException, requests.exceptions.RequestException


def stop_container(container) -> None:
    """SIGTERM to every process of a step's container but PID 1 (`kill -1` spares the caller and init): the step's
    Python ends as it would by a terminal's signal (training saves a checkpoint first), and its `sh -c` with it."""
    with contextlib.suppress(*_docker_errors()):
        container.exec_run(["sh", "-c", "kill -TERM -1"], detach=True)


def follow_until_exit(container, poll_seconds: float = 0.5, drain_seconds: float | None = None) -> int:
    """Print a step container's output as it comes and return its exit code, once it has exited.

    The engine is asked for the container's state, not to tell when it ends: podman 4.3's Docker API (Debian 12's)
    sometimes left `wait` unanswered, and the followed output stream open, for good, after the step had exited
    (seen here; podman's issues 10256 and 28514 are of the same kind). So the output is streamed by a thread of its
    own while the state is polled here; when the step has exited and its stream is still open after
    `drain_seconds`, the stream is closed and what it had not yet printed is read once, in full."""
    printed = 0
    lock = threading.Lock()
    abandoned = False
    finished = threading.Event()
    stream = container.logs(stream=True, follow=True)

    def pump() -> None:
        nonlocal printed
        try:
            for chunk in stream:
                with lock:
                    if abandoned:
                        return
                    print(chunk.decode(errors="replace"), end="", flush=True)
                    printed += len(chunk)
        except (*_docker_errors(), OSError, ValueError, AttributeError):
            pass  # the stream closed under it (below), or the engine went away
        finally:
            finished.set()

    threading.Thread(target=pump, name="step-container-output", daemon=True).start()
    while True:
        container.reload()
        if container.status in ENDED:
            exit_code = int(container.attrs["State"]["ExitCode"])
            break
        time.sleep(poll_seconds)
    if not finished.wait(DRAIN_SECONDS if drain_seconds is None else drain_seconds):
        with lock:
            abandoned = True
        with contextlib.suppress(*_docker_errors(), OSError, AttributeError):
            stream.close()
        with contextlib.suppress(*_docker_errors()):
            rest = container.logs(stdout=True, stderr=True)[printed:]
            print(rest.decode(errors="replace"), end="", flush=True)
    return exit_code


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def remove_container(container, seconds: float = REMOVE_SECONDS) -> bool:
    """Remove a step's container (by force: also a running one), waiting at most `seconds`: podman 4.3's Docker API
    sometimes never answered a removal (seen here, after a stopped run; podman's own `podman rm -f` then removed the
    container at once), and a run must not hang on its cleanup. A container left is said in one line."""
    outcome: list[BaseException | None] = []

    def remove() -> None:
        try:
            container.remove(force=True)
            outcome.append(None)
        except _docker_errors() as error:
            outcome.append(error)

    worker = threading.Thread(target=remove, name="step-container-remove", daemon=True)
    worker.start()
    worker.join(seconds)
    gone = bool(outcome) and (outcome[0] is None or _is_not_found(outcome[0]))
    if not gone:
        reason = f"the engine said: {outcome[0]}" if outcome else f"the engine did not answer within {seconds:.0f} s"
        logger.warning("container %s of a step was not removed (%s); remove it with: docker rm -f %s",
                       container.id[:12], reason, container.id[:12])  # fmt: skip
    return gone


def _is_not_found(error: BaseException) -> bool:
    import docker.errors

    return isinstance(error, docker.errors.NotFound)


def kill_container(container) -> None:
    with contextlib.suppress(*_docker_errors()):
        container.kill()


def reap(grace_seconds: float, stream=None, docker_client=None, late_seconds: float = LATE_CONTAINER_SECONDS) -> int:
    """The reaper: read step groups (`<pid>`) and the run's container label (`containers <owner>`) from stdin until
    `done` (a normal end: nothing to do) or end of file (local-run died): then SIGTERM to every step still running,
    SIGKILL to what is left after the grace period, and every container of the run removed, also one that the engine
    finishes creating for `late_seconds` after that (its creation was under way when local-run died)."""
    stream = stream or sys.stdin.buffer
    groups: list[int] = []
    owner = None
    for line in stream:
        if line == DONE:
            return 0
        words = line.split()
        if len(words) == 2 and words[0] == b"containers":
            owner = words[1].decode()
        with contextlib.suppress(ValueError):
            groups.append(int(line))
    containers = RunContainers(owner, docker_client) if owner else None
    alive = [group for group in groups if _group_alive(group)]
    for group in alive:
        _signal_group(group, signal.SIGTERM)
    running = containers.stop_running() if containers else []
    deadline = time.monotonic() + grace_seconds
    while (alive or running) and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [group for group in alive if _group_alive(group)]
        running = containers.stop_running() if containers else []
    for group in alive:
        _signal_group(group, signal.SIGKILL)
    if containers:
        containers.remove_all(late_seconds)
    return 0


class RunContainers:
    """For the reaper: the containers labelled with a local-run's owner label, found by asking the engine."""

    def __init__(self, owner: str, docker_client=None):
        self.owner, self.client, self.stopped = owner, docker_client, set()

    def labelled(self) -> list:
        try:
            if self.client is None:
                import docker

                self.client = docker.from_env(timeout=START_SECONDS)
            return self.client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={self.owner}"})
        except _docker_errors() as error:
            print(f"step reaper: the run's containers ({OWNER_LABEL}={self.owner}) could not be listed: "
                  f"{_one_line(error)}", file=sys.stderr)  # fmt: skip
            return []

    def stop_running(self) -> list:
        """SIGTERM to each running container not yet stopped; returns those still running."""
        running = [container for container in self.labelled() if container.status in RUNNING]
        for container in running:
            if container.id not in self.stopped:
                self.stopped.add(container.id)
                stop_container(container)
        return running

    def remove_all(self, late_seconds: float) -> None:
        deadline = time.monotonic() + late_seconds
        while True:
            for container in self.labelled():
                remove_container(container)
            if time.monotonic() >= deadline:
                return
            time.sleep(2.0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is local-run's to handle, not the reaper's
    sys.exit(reap(float(sys.argv[1])))
