"""RUNNER=docker: each step's container is owned by local-run (pipeline/step_processes.py), as a step process is.

Without an engine here, the containers are stand-ins that answer the Docker SDK's calls the way a step's container
does: the step's processes end with 143 on SIGTERM (a stubborn one does not), `kill` ends the container with 137,
and a removed container is gone. `make test-images` runs the same through a real engine.
"""

from __future__ import annotations

import io
import signal
import threading
import time
import types

import docker.errors
import pytest

from pipeline.step_processes import OWNER_LABEL, StepProcesses, reap

STOP_COMMAND = ["sh", "-c", "kill -TERM -1"]


class FakeContainer:
    def __init__(self, container_id: str, exit_code: int | None = None, stubborn: bool = False, ended="exited"):
        self.id = container_id
        self.ended_status = ended  # Docker's; podman 4.3's Docker API says "stopped"
        self.status_before_start = "running"  # "created": made, never started
        self.stubborn = stubborn
        self.exit_code = exit_code  # ends by itself with this code
        self.executed: list[list[str]] = []
        self.labels: dict[str, str] = {}
        self.killed = self.removed = False
        self.ended = threading.Event()
        if exit_code is not None:
            self.ended.set()

    @property
    def status(self) -> str:
        return self.ended_status if self.ended.is_set() else self.status_before_start

    @property
    def attrs(self) -> dict:
        return {"State": {"Status": self.status, "ExitCode": self.exit_code if self.ended.is_set() else 0}}

    def reload(self):
        if self.removed:
            raise docker.errors.NotFound("no such container")

    OUTPUT = (b"step: started\n", b"step: done\n")

    def logs(self, stream: bool = False, follow: bool = False, stdout: bool = True, stderr: bool = True):
        if not stream:
            return b"".join(self.OUTPUT) if self.ended.is_set() else self.OUTPUT[0]
        assert follow
        return FakeStream(self)

    def wait(self):
        raise AssertionError("podman 4.3's Docker API may never answer `wait` for a container that already exited")

    def exec_run(self, command, detach=False):
        self.executed.append(command)
        if command == STOP_COMMAND and not self.stubborn:
            self._end(143)

    def kill(self):
        self.killed = True
        self._end(137)

    def remove(self, force=False):
        if not self.ended.is_set():
            assert force, "a running container is removed only with force"
            self._end(137)
        self.removed = True

    def _end(self, code: int) -> None:
        if not self.ended.is_set():
            self.exit_code = code
            self.ended.set()


class FakeStream:
    """A followed output stream: the first line at once, the second when the step ends, then the stream ends, unless
    it is one that stays open (as podman 4.3's sometimes did) until closed."""

    def __init__(self, container: FakeContainer, stays_open: bool = False):
        self.container, self.stays_open, self.closed = container, stays_open, threading.Event()

    def __iter__(self):
        yield self.container.OUTPUT[0]
        self.container.ended.wait(timeout=30)
        if self.stays_open:
            self.closed.wait(timeout=30)
            raise AttributeError("'NoneType' object has no attribute 'read'")  # what a closed response raises
        yield self.container.OUTPUT[1]

    def close(self):
        self.closed.set()


class FakeClient:
    def __init__(self, *containers: FakeContainer):
        self.waiting = list(containers)
        self.known = {container.id: container for container in containers}
        self.images = types.SimpleNamespace(list=lambda: [types.SimpleNamespace(tags=["step:latest"], attrs={})])
        self.containers = types.SimpleNamespace(run=self._run, list=self._list)
        self.api = types.SimpleNamespace(timeout=60)  # the Docker SDK's default, per request
        self.refusal: Exception | None = None

    def _run(self, image, command, volumes, detach, **run_arguments):
        assert detach and image == "step:latest"
        if self.refusal is not None:
            raise self.refusal
        container = self.waiting.pop(0)
        container.labels = run_arguments["labels"]
        return container

    def _list(self, all: bool, filters: dict):
        assert all, "stopped and created containers are the run's too"
        key, value = filters["label"].split("=", 1)
        return [c for c in self.known.values() if not c.removed and c.labels.get(key) == value]


def run_in_background(steps: StepProcesses, client: FakeClient) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(steps.run_container(client, "step", ["python"], {})))
    thread.start()
    return thread, codes


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("ended", ["exited", "stopped"])
def test_a_steps_exit_code_is_read_before_its_container_is_removed_and_decides_the_runs(capsys, ended):
    steps = StepProcesses(grace_seconds=1.0)
    bad_input = FakeContainer("step-1", exit_code=2, ended=ended)
    assert steps.run_container(FakeClient(bad_input), "step", ["python"], {}) == 2
    assert bad_input.removed and steps.exit_codes == [2] and steps.failure_exit_code() == 2
    assert capsys.readouterr().out == "step: started\nstep: done\n"  # the step's output goes on to the run's log


def test_stopping_the_run_stops_each_running_container_and_kills_it_after_the_grace():
    steps = StepProcesses(grace_seconds=1.0)
    training, stubborn = FakeContainer("train"), FakeContainer("stubborn", stubborn=True)
    client = FakeClient(training, stubborn)
    first, first_codes = run_in_background(steps, client)
    second, second_codes = run_in_background(steps, client)
    wait_until(lambda: len(steps._containers) == 2)
    started = time.monotonic()
    steps._on_signal(signal.SIGTERM, None)
    first.join(timeout=10)
    second.join(timeout=10)
    assert training.executed == [STOP_COMMAND] and not training.killed and first_codes == [143]
    assert stubborn.executed == [STOP_COMMAND] and stubborn.killed and second_codes == [137]
    assert 0.9 < time.monotonic() - started < 5  # the stubborn one had the grace period, no more
    assert training.removed and stubborn.removed and steps.stopped_by == signal.SIGTERM


def test_a_second_signal_kills_the_containers_at_once():
    steps = StepProcesses(grace_seconds=60.0)
    stubborn = FakeContainer("stubborn", stubborn=True)
    thread, codes = run_in_background(steps, FakeClient(stubborn))
    wait_until(lambda: steps._containers)
    steps._on_signal(signal.SIGINT, None)
    steps._on_signal(signal.SIGINT, None)
    thread.join(timeout=10)
    assert codes == [137] and stubborn.killed


def test_a_container_started_after_the_run_was_stopped_is_stopped_too():
    steps = StepProcesses(grace_seconds=1.0)
    steps._on_signal(signal.SIGTERM, None)
    late = FakeContainer("clean-up")
    assert steps.run_container(FakeClient(late), "step", ["python"], {}) == 143
    assert late.executed == [STOP_COMMAND]


def test_the_reaper_stops_and_removes_the_containers_of_a_local_run_that_died():
    """Found by the run's owner label: the running ones are stopped (killed with the removal after the grace), the
    ended ones removed, and one the engine finished creating after local-run died removed too."""
    owner = {OWNER_LABEL: "host-123-456"}
    training, stubborn, ended = FakeContainer("train"), FakeContainer("stubborn", stubborn=True), FakeContainer("x", 0)
    late, another_runs = FakeContainer("late"), FakeContainer("other")
    for container in (training, stubborn, ended, late):
        container.labels = owner
    another_runs.labels = {OWNER_LABEL: "host-123-789"}
    late.status_before_start = "created"
    client = FakeClient(training, stubborn, ended, another_runs)
    threading.Timer(1.5, lambda: client.known.update(late=late)).start()  # its creation was under way
    started = time.monotonic()
    reap(1.0, io.BytesIO(b"123\ncontainers host-123-456\n"), docker_client=client, late_seconds=3.0)
    assert training.executed == [STOP_COMMAND] and training.exit_code == 143 and training.removed
    assert stubborn.removed and stubborn.exit_code == 137  # after the grace, removed by force
    assert ended.removed and late.removed and not another_runs.removed
    assert late.executed == []  # never started: nothing to stop
    assert time.monotonic() - started < 10
    untouched = FakeContainer("train")
    untouched.labels = owner
    reap(1.0, io.BytesIO(b"containers host-123-456\ndone\n"), docker_client=FakeClient(untouched))  # ended normally
    assert untouched.executed == [] and not untouched.removed


def test_every_container_carries_its_runs_owner_label_which_the_reaper_is_told_first():
    steps = StepProcesses(grace_seconds=1.0)
    told = []
    steps._tell_reaper = told.append
    step = FakeContainer("step", exit_code=0)
    steps.run_container(FakeClient(step), "step", ["python"], {}, labels={"team": "vision"})
    assert step.labels == {"team": "vision", OWNER_LABEL: steps.owner}
    assert told == [f"containers {steps.owner}\n"]


@pytest.mark.parametrize("error", [docker.errors.NotFound("gone"), docker.errors.APIError("engine down")])
def test_a_container_call_that_fails_does_not_stop_the_others(error):
    """A container that ended between the listing and the call, or an engine that stopped answering."""
    steps = StepProcesses(grace_seconds=1.0)
    gone, training = FakeContainer("gone"), FakeContainer("train")

    def fails(*_arguments, **_keywords):
        raise error

    gone.exec_run = gone.kill = fails
    client = FakeClient(gone, training)
    first, first_codes = run_in_background(steps, client)
    second, second_codes = run_in_background(steps, client)
    wait_until(lambda: len(steps._containers) == 2)
    steps._on_signal(signal.SIGTERM, None)
    second.join(timeout=10)
    assert second_codes == [143]
    gone._end(137)  # it ends on its own; the failed calls raised nowhere
    first.join(timeout=10)
    assert first_codes == [137] and gone.removed and not first.is_alive()


def test_a_removal_the_engine_never_answers_does_not_hold_up_the_run(caplog):
    """The step's exit code is already read; the container left is said in one line, with the command to remove it."""
    from pipeline.step_processes import remove_container

    stuck = FakeContainer("0123456789abcdef", exit_code=0)
    never = threading.Event()
    stuck.remove = lambda force: never.wait(timeout=30)
    started = time.monotonic()
    assert remove_container(stuck, seconds=1.0) is False
    assert time.monotonic() - started < 5
    assert "container 0123456789ab of a step was not removed (the engine did not answer within 1 s)" in caplog.text
    assert "docker rm -f 0123456789ab" in caplog.text
    never.set()
    assert remove_container(FakeContainer("gone", exit_code=0), seconds=5) is True


def test_an_output_stream_left_open_after_the_step_exited_does_not_hold_up_the_run(capsys, monkeypatch):
    """The exit code comes from the container's state; the output the stream had not printed is read in full."""
    from pipeline import step_processes

    monkeypatch.setattr(step_processes, "DRAIN_SECONDS", 1.0)
    steps = StepProcesses(grace_seconds=1.0)
    step = FakeContainer("prepare-data")
    stream = FakeStream(step, stays_open=True)
    step.logs = lambda **keywords: stream if keywords.get("stream") else FakeContainer.logs(step)
    threading.Timer(0.5, step._end, args=(0,)).start()
    started = time.monotonic()
    thread, codes = run_in_background(steps, FakeClient(step))
    thread.join(timeout=15)
    assert codes == [0] and step.removed and stream.closed.is_set()
    assert time.monotonic() - started < 10
    assert capsys.readouterr().out == "step: started\nstep: done\n"  # nothing lost, nothing twice


def test_a_container_the_engine_does_not_start_fails_its_step_in_one_line(capsys):
    """A timeout or a refusal while the engine creates the container (it copies the image on vfs storage, which took
    over the SDK's 60 s here): the step fails with one line, not a traceback that ends the run."""
    import requests.exceptions

    steps = StepProcesses(grace_seconds=1.0)
    client = FakeClient()
    client.refusal = requests.exceptions.ReadTimeout("UnixHTTPConnectionPool(host='localhost'): Read timed out.")
    assert steps.run_container(client, "step", ["python"], {}) == 1
    assert client.api.timeout >= 600, "creating a container may take minutes where the engine copies the image"
    assert capsys.readouterr().out == (
        "the step's container could not be started: UnixHTTPConnectionPool(host='localhost'): Read timed out.\n"
    )
    client.refusal = docker.errors.ImageNotFound("No such image: step:latest")
    assert steps.run_container(client, "step", ["python"], {}) == 1 and steps.exit_codes == [1, 1]


def test_steps_on_threads_indent_their_own_lines_and_leave_print_as_it_was(capsys):
    """kfp.local runs a ParallelFor's steps on threads, each inside `indented_print`: a step that ends while another
    runs left kfp's indenting print in place for the rest of the run. The run's own (thread-safe) one does not."""
    import builtins

    from kfp.local import logging_utils

    from pipeline.step_processes import IndentedPrint

    def interleaved(indented_print) -> None:  # two steps on threads of their own; the first ends while the second runs
        first_in, second_in, first_out, run_said = (threading.Event() for _ in range(4))

        def first_step():
            with indented_print():
                print("first step's line")
                first_in.set()
                assert second_in.wait(10)
            first_out.set()

        def second_step():
            assert first_in.wait(10)
            with indented_print():
                second_in.set()
                assert run_said.wait(10)

        steps = [threading.Thread(target=step) for step in (first_step, second_step)]
        for step in steps:
            step.start()
        assert first_out.wait(10)
        print("a line of the run's own")
        run_said.set()
        for step in steps:
            step.join()

    original = builtins.print
    try:
        interleaved(logging_utils.indented_print)
        assert builtins.print is not original, "kfp's indented_print is safe on threads now: drop IndentedPrint"
    finally:
        builtins.print = original
    capsys.readouterr()
    interleaved(IndentedPrint())
    assert builtins.print is original
    print("after the steps")
    assert capsys.readouterr().out == "    first step's line\na line of the run's own\nafter the steps\n"
