"""A local run's `local-run.log` is live: every line a step prints is in the file as soon as it is printed, so a run
that is stopped, or watched with `tail -f`, leaves the record of what it did up to that moment."""

from __future__ import annotations

from pipeline import terminal


def test_every_line_is_in_the_log_file_as_soon_as_it_is_printed(tmp_path, capsys):
    log_path = tmp_path / "run" / "local-run.log"
    with terminal.steps_shown(log_path, verbose=False):
        print("12:00:00.000 - INFO - Executing task 'train-component'")  # kfp.local's line, as it prints it
        print("[worker-0] 2026-11-25 12:00:01,000 INFO components.train.loop: step 15/300 loss 0.5000 accuracy 0.9")
        print("[worker-1] 2026-11-25 12:00:01,000 INFO components.train.loop: step 15/300 loss 0.5000 accuracy 0.9")
        written = log_path.read_text()  # while the step is still running
        assert "[worker-0] 2026-11-25 12:00:01,000 INFO components.train.loop: step 15/300" in written
        assert "[worker-1]" in written  # the log has every worker; the terminal only the chief
    shown = capsys.readouterr().out
    assert "train: step 15/300" in shown and "[worker-1]" not in shown


def test_an_interrupted_run_exits_by_the_signal_that_stopped_it():
    import signal

    from pipeline.local_run import RunInterruptedError

    assert RunInterruptedError("x", signal.SIGINT).exit_code == 130  # Ctrl-C
    assert RunInterruptedError("x", signal.SIGTERM).exit_code == 143  # timeout(1), a closed session, kill


def test_the_reaper_stops_the_groups_of_a_local_run_that_died(tmp_path):
    """What runs when local-run is killed: every step group it named gets SIGTERM (then SIGKILL after the grace)."""
    import io
    import subprocess
    import time

    from pipeline.step_processes import reap

    step = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60"], start_new_session=True)
    time.sleep(0.2)
    started = time.monotonic()
    reap(1.0, io.BytesIO(f"{step.pid}\n{stubborn.pid}\n".encode()))  # end of file: local-run is gone
    assert step.wait(timeout=5) == -15 and stubborn.wait(timeout=5) == -9
    assert time.monotonic() - started < 5
    assert reap(1.0, io.BytesIO(b"12345\ndone\n")) == 0  # a run that ended normally: nothing is signalled


def test_a_stages_child_process_ends_when_its_parent_is_killed():
    """components/common/processes.py: the canary and TensorBoard's server end with the stage that started them."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen(
        [sys.executable, "-c", "import time; from components.common import processes; "
         "child = processes.start(['sleep', '120']); print(child.pid, flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.1)
    assert not _running(child), "the child outlived its killed parent"


def _running(pid: int) -> bool:
    from pathlib import Path

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status


def test_a_sweeps_trials_show_their_measures_on_the_terminal_as_they_come(tmp_path, capsys):
    """A trial trains for minutes: each validation measure it reports is shown, not only its start and its end."""
    with terminal.steps_shown(tmp_path / "run" / "local-run.log", verbose=False):
        print("12:00:00.000 - INFO - Executing task 'sweep-component'")
        for message in ("trial 0 started: learning_rate=0.05",
                        "trial 0 step 40: validation accuracy 0.4000 (0 of 4 trials finished)",
                        "trial 0 validation accuracy 0.7000 (1 of 4 trials finished, best 0.7000, about 3m left)",
                        "checked the conditional writes of x in 0.01 s"):  # fmt: skip
            print(f"2026-11-25 12:00:01,000 INFO components.sweep.sweep: {message}")
    shown = capsys.readouterr().out
    assert "trial 0 step 40: validation accuracy 0.4000 (0 of 4 trials finished)" in shown
    assert "trial 0 started" in shown and "trial 0 validation accuracy 0.7000" in shown
    assert "checked the conditional writes" not in shown
