"""Training as real processes: two local workers, a killed worker, SIGTERM, and a kill followed by a restart."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import tensorflow as tf

from components.common.config import config_to_dict
from components.train import checkpoints
from tests.builders import refused_port, tiny_train_config

REPOSITORY = Path(__file__).resolve().parents[1]
TRAINABLE_KINDS = ("kernel", "gamma", "beta", "bias")


def train_command(config) -> list[str]:
    return [sys.executable, "-m", "components.train", "--config", json.dumps(config_to_dict(config))]


def run_training(config, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(config), cwd=REPOSITORY, capture_output=True, text=True, timeout=timeout, env=_environment()
    )


def _environment() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


class LiveProcess:
    """A training process whose merged output is read line by line while it runs. It runs in a session of its
    own, so that a failing test can stop it and every worker it started (`stop_left_over_processes`)."""

    started: ClassVar[list[LiveProcess]] = []

    def __init__(self, config, **environment):
        self.process = subprocess.Popen(
            train_command(config),
            cwd=REPOSITORY,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**_environment(), **environment},
            start_new_session=True,
        )
        self.lines: list[str] = []
        LiveProcess.started.append(self)

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match:
        deadline = time.monotonic() + timeout
        for line in self.process.stdout:
            self.lines.append(line)
            match = re.search(pattern, line)
            if match:
                return match
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"{pattern!r} never appeared; output:\n{''.join(self.lines[-40:])}")

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        rest, _ = self.process.communicate(timeout=timeout)
        self.lines.append(rest)
        return self.process.returncode, "".join(self.lines)


@pytest.fixture(autouse=True)
def stop_left_over_processes():
    yield
    while LiveProcess.started:
        live = LiveProcess.started.pop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(live.process.pid, signal.SIGKILL)
        live.process.wait()


def checkpoint_weights(path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(path))
    return {
        name: reader.get_tensor(key)
        for name, key in checkpoints.checkpoint_variable_names(str(path)).items()
        if name.endswith(TRAINABLE_KINDS)
    }


@pytest.fixture
def start_checkpoint(synthetic_data, tmp_path):
    from components.train import loop

    loop.train(tiny_train_config(synthetic_data, tmp_path / "start", train_steps=1))
    return tmp_path / "start" / "ckpt-1"


def test_two_local_workers_hold_identical_weights_and_match_one_worker(synthetic_data, tmp_path, start_checkpoint):
    # Same start, same examples per step (no shuffling, no augmentation; each worker takes every other record,
    # so the two halves of a step are exactly the single worker's batch), same global batch.
    common = {"train_steps": 3, "warm_start": str(start_checkpoint), "augment": False, "shuffle_buffer": 1}
    two = tiny_train_config(synthetic_data, tmp_path / "two", workers=2, **common)
    one = tiny_train_config(synthetic_data, tmp_path / "one", workers=1, **common)

    completed = run_training(two)
    assert completed.returncode == 0, completed.stderr[-3000:]
    digests = re.findall(r"\[(worker-\d)\].*weights sha256 ([0-9a-f]{64})", completed.stderr)
    assert sorted(worker for worker, _ in digests) == ["worker-0", "worker-1"], completed.stderr[-3000:]
    assert digests[0][1] == digests[1][1], "the two workers ended with different weights"
    assert "MultiWorkerMirroredStrategy: worker-1 of 2 workers" in completed.stderr

    assert run_training(one).returncode == 0
    start = checkpoint_weights(start_checkpoint)
    with_two, with_one = (
        checkpoint_weights(tmp_path / "two" / "ckpt-3"),
        checkpoint_weights(tmp_path / "one" / "ckpt-3"),
    )
    change_two = np.concatenate([(with_two[name] - start[name]).ravel() for name in sorted(start)])
    change_one = np.concatenate([(with_one[name] - start[name]).ravel() for name in sorted(start)])
    # Batch norm normalizes each replica's 16-image half-batch on its own, so the runs agree closely, not bit
    # for bit (measured: 0.14 after 3 steps). A gradient scaled by the per-replica instead of the global batch
    # would double the step (1.0); a missing all-reduce would already have split the workers' weights above.
    assert np.linalg.norm(change_two - change_one) / np.linalg.norm(change_one) < 0.25


def test_two_workers_train_the_airbench94_preset_to_identical_weights(synthetic_data, tmp_path):
    """The airbench94 preset on two workers, shrunk to a few steps: the patch whitening is fitted from the
    chief's training images and broadcast, alternating flips and lookahead run, and both workers end identical."""
    config = tiny_train_config(
        synthetic_data,
        tmp_path / "airbench",
        preset="airbench94",
        width_multiplier=0.125,
        batch_size=32,
        learning_rate_batch_size=32,
        lookahead_start_epochs=0.0,
        lookahead_every_steps=2,
        workers=2,
        train_steps=3,
    )
    assert (config.model, config.augmentation, config.schedule) == ("airbench", "airbench", "triangular")
    completed = run_training(config)
    assert completed.returncode == 0, completed.stderr[-3000:]
    fitted = re.findall(r"\[(worker-\d)\].*patch whitening fitted by the chief", completed.stderr)
    assert sorted(fitted) == ["worker-0", "worker-1"], completed.stderr[-3000:]
    digests = re.findall(r"\[(worker-\d)\].*weights sha256 ([0-9a-f]{64})", completed.stderr)
    assert len(digests) == 2 and digests[0][1] == digests[1][1], "the two workers ended with different weights"
    reader = tf.train.load_checkpoint(str(tmp_path / "airbench" / "ckpt-3"))
    names = checkpoints.checkpoint_variable_names(str(tmp_path / "airbench" / "ckpt-3"))
    from components.common.dataset import open_dataset
    from components.common.model import PatchWhitening

    dataset = open_dataset(synthetic_data, splits=("train",))
    first_images, _labels = next(iter(dataset.tf_dataset("train", batch_size=5000)))
    expected = PatchWhitening().fitted_values(first_images.numpy())[2]  # what the chief fits
    np.testing.assert_allclose(reader.get_tensor(names["whitening/kernel"]), expected, rtol=1e-4, atol=1e-5)


def test_a_killed_worker_fails_the_job_quickly_with_a_clear_message(synthetic_data, tmp_path):
    config = tiny_train_config(
        synthetic_data,
        tmp_path / "model",
        workers=2,
        train_steps=100000,
        log_every_steps=10,
        worker_failure_timeout_seconds=5,
    )
    scratch = tmp_path / "tmp"  # the workers' temporary directory, to see what they leave there
    scratch.mkdir()
    live = LiveProcess(config, TMPDIR=str(scratch))
    pid = int(live.wait_for(r"started worker-1 \(pid (\d+)\)").group(1))
    live.wait_for(r"\[worker-1\].*step 10/")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    code, output = live.finish(timeout=120)
    assert code != 0
    assert time.monotonic() - killed_at < 60
    assert "worker-1 was killed by signal 9 (SIGKILL); stopping the other workers" in output
    # The killed worker could not remove its scratch copy; the next run on this machine does.
    rerun = LiveProcess(
        dataclasses.replace(config, model_dir=str(tmp_path / "other"), train_steps=2), TMPDIR=str(scratch)
    )
    assert rerun.finish(timeout=180)[0] == 0
    assert sorted(path.name for path in scratch.iterdir() if not path.name.startswith("__autograph_generated")) == []


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_ctrl_c_saves_a_checkpoint_and_exits_with_a_retryable_code(synthetic_data, tmp_path, signal_number):
    model_dir = tmp_path / "model"
    live = LiveProcess(tiny_train_config(synthetic_data, model_dir, train_steps=100000, log_every_steps=10))
    live.wait_for(r"step 20/")
    live.process.send_signal(signal_number)
    code, output = live.finish()
    assert code == 143, output[-2000:]
    assert "Traceback" not in output
    saved = int(re.search(r"saved checkpoint .*ckpt-(\d+)", output).group(1))
    assert saved >= 20
    metrics = json.loads((model_dir / "train_metrics.json").read_text())
    assert metrics["preempted"] is True and metrics["step"] == saved


def test_a_killed_run_restarts_from_its_last_checkpoint_and_reaches_the_planned_step(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    config = tiny_train_config(
        synthetic_data, model_dir, train_steps=400, checkpoint_every_steps=10, log_every_steps=10
    )
    live = LiveProcess(config)
    live.wait_for(r"saved checkpoint .*ckpt-20")
    live.process.kill()
    live.finish()
    saved = max(int(path.name.split("-")[1].split(".")[0]) for path in model_dir.glob("ckpt-*.index"))
    assert saved < 400

    completed = run_training(
        tiny_train_config(synthetic_data, model_dir, train_steps=saved + 15, checkpoint_every_steps=10)
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert f"at step {saved}" in completed.stderr
    assert json.loads((model_dir / "train_metrics.json").read_text())["step"] == saved + 15


def test_sigterm_to_the_local_launcher_makes_both_workers_checkpoint_the_same_step(synthetic_data, tmp_path):
    model_dir = tmp_path / "model"
    live = LiveProcess(tiny_train_config(synthetic_data, model_dir, workers=2, train_steps=100000, log_every_steps=10))
    live.wait_for(r"\[worker-1\].*step 20/")
    live.process.send_signal(signal.SIGTERM)
    code, output = live.finish()
    assert code == 143, output[-3000:]
    steps = dict(re.findall(r"\[(worker-\d)\].*weights sha256 [0-9a-f]{64} \(worker-\d\) at step (\d+)", output))
    assert set(steps) == {"worker-0", "worker-1"} and steps["worker-0"] == steps["worker-1"], output[-3000:]
    assert (model_dir / f"ckpt-{steps['worker-0']}.index").exists()


def test_a_trial_katib_stops_early_checkpoints_on_every_worker_and_exits_0_not_to_be_restarted(
    synthetic_data, tmp_path
):
    """Katib's metrics collector marks the trial's shell "early-stopped" (/var/log/katib/<pid>.pid), then sends the
    training process SIGTERM: one worker gets it; both checkpoint one agreed step and exit 0, which neither the
    TrainJob runtime's "Preempted" rule (143) nor TFJob's ExitCode policy restarts. Without the mark, the same SIGTERM
    is a preemption (143: test_sigterm_to_the_local_launcher_makes_both_workers_checkpoint_the_same_step)."""
    model_dir, katib = tmp_path / "model", tmp_path / "katib"
    katib.mkdir()
    config = tiny_train_config(synthetic_data, model_dir, workers=2, train_steps=100000, log_every_steps=10)
    live = LiveProcess(config, CIFAR10_PIPELINE_KATIB_FOLDER=str(katib))
    worker = int(live.wait_for(r"started worker-0 \(pid (\d+)\)").group(1))
    live.wait_for(r"\[worker-1\].*step 20/")
    (katib / f"{live.process.pid}.pid").write_text("early-stopped")  # the trial's shell: this worker's launcher
    os.kill(worker, signal.SIGTERM)
    code, output = live.finish()
    assert code == 0, output[-3000:]
    assert "SIGTERM from Katib's early stopping" in output and "stopped early by Katib at step" in output
    steps = dict(re.findall(r"\[(worker-\d)\].*weights sha256 [0-9a-f]{64} \(worker-\d\) at step (\d+)", output))
    assert set(steps) == {"worker-0", "worker-1"} and steps["worker-0"] == steps["worker-1"], output[-3000:]
    metrics = json.loads((model_dir / "train_metrics.json").read_text())
    assert metrics["stopped_early"] is True and metrics["preempted"] is False
    assert (model_dir / f"ckpt-{steps['worker-0']}.index").exists()


def test_two_local_workers_train_into_and_resume_from_an_s3_model_directory(synthetic_data, tmp_path, s3_bucket):
    """The KFP default store (S3-compatible): two worker processes train into s3://, a second run resumes there."""
    from components.common import storage

    model_dir = f"s3://{s3_bucket}/runs/7/model-directory"
    first = tiny_train_config(
        synthetic_data, model_dir, workers=2, train_steps=4, checkpoint_every_steps=2, cache_dir=str(tmp_path / "a")
    )
    completed = run_training(first)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "ckpt-4.index" in storage.publisher_for(model_dir).list()

    again = tiny_train_config(
        synthetic_data, model_dir, workers=2, train_steps=6, checkpoint_every_steps=2, cache_dir=str(tmp_path / "b")
    )
    completed = run_training(again)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert re.search(r"resum\w+ .*step 4", completed.stderr), completed.stderr[-3000:]
    summary = json.loads(storage.read_bytes(f"{model_dir}/train_metrics.json"))
    assert summary["step"] == 6 and summary["checkpoint"] == f"{model_dir}/ckpt-6"


def test_a_model_directory_has_one_writer_and_a_dead_writers_claim_is_taken_over(synthetic_data, tmp_path):
    from components.common.writer_claim import WriterClaimError
    from components.train import loop

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom components.common.model_directory import ModelDirectory\n"
         f"directory = ModelDirectory({str(model_dir)!r})\ndirectory.claim_writer()\nprint('claimed', flush=True)\n"
         "sys.stdin.read()"],
        cwd=REPOSITORY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "claimed"
        started = time.monotonic()
        with pytest.raises(WriterClaimError, match=rf"is being written by pid {holder.pid} on .*one writer at a time"):
            loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=2))
        assert time.monotonic() - started < 10 and not list(model_dir.glob("ckpt-*"))
    finally:
        holder.kill()  # kill -9: the claim dies with its process
        holder.wait()
    assert loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=2)).step == 2


def test_workers_end_when_their_launcher_is_killed(synthetic_data, tmp_path):
    config = tiny_train_config(
        synthetic_data, tmp_path / "model", workers=2, train_steps=100_000, log_every_steps=1, checkpoint_every_steps=50
    )
    launcher = LiveProcess(config)
    pids = [int(launcher.wait_for(rf"started worker-{index} \(pid (\d+)\)").group(1)) for index in range(2)]
    launcher.wait_for(r"\[worker-0\].*step 2/")
    launcher.process.kill()  # kill -9: the launcher cannot pass anything on
    launcher.process.wait()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.5)
    assert not any(_alive(pid) for pid in pids), "workers kept running without their launcher"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie has ended; only its parent's wait is missing
        return handle.read().split(")")[-1].split()[0] != "Z"


def _worker_environment(addresses: list[str], index: int) -> dict[str, str]:
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    return {**_environment(), "TF_CONFIG": json.dumps(tf_config)}


def test_a_worker_whose_peers_never_come_gives_up_naming_them(synthetic_data, tmp_path):
    from components.train.launch_local import free_ports

    addresses = [f"127.0.0.1:{port}" for port in (free_ports(1)[0], refused_port(), refused_port())]
    config = tiny_train_config(synthetic_data, tmp_path / "model", workers=3, batch_size=30, peer_timeout_seconds=4)
    started = time.monotonic()
    completed = subprocess.run(
        train_command(config), cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
        env=_worker_environment(addresses, 0),
    )  # fmt: skip
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert len(errors) == 1 and re.search(
        rf"worker-0: gave up after 4 s waiting for worker-1 \({addresses[1]}\), worker-2 \({addresses[2]}\) to start",
        errors[0],
    ), completed.stderr[-3000:]
    assert time.monotonic() - started < 60


def test_sigterm_while_a_worker_waits_for_its_peers_exits_143_at_once(synthetic_data, tmp_path):
    from components.train.launch_local import free_ports

    addresses = [f"127.0.0.1:{port}" for port in (refused_port(), free_ports(1)[0])]
    config = tiny_train_config(synthetic_data, tmp_path / "model", workers=2)
    process = subprocess.Popen(
        train_command(config), cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_worker_environment(addresses, 1),
    )  # fmt: skip
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "waiting for worker-0" in line:
            break
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    lines.append(process.communicate(timeout=60)[0])
    assert process.returncode == 143, "".join(lines)[-3000:]
    assert time.monotonic() - started < 10
    assert re.search(r"SIGTERM during start-up \(waiting for peers\)", "".join(lines))


@pytest.mark.parametrize("moment", ["cluster formed", "first step"])
def test_sigterm_during_start_up_ends_every_worker_with_143(synthetic_data, tmp_path, moment):
    """The window the outside test found: after the strategy exists (TensorFlow's own handler is installed) and
    before or at the first step. Every worker gets the signal, as when a TFJob is deleted."""
    config = tiny_train_config(synthetic_data, tmp_path / "model", workers=2, train_steps=100_000, log_every_steps=1)
    launcher = LiveProcess(config)
    pids = [int(launcher.wait_for(rf"started worker-{index} \(pid (\d+)\)").group(1)) for index in range(2)]
    launcher.wait_for(r"MultiWorkerMirroredStrategy: worker-0" if moment == "cluster formed" else r"step 1/")
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    code, output = launcher.finish(timeout=120)
    assert code == 143, output[-3000:]
    assert "step 100000/" not in output
    steps = [int(step) for step in re.findall(r"step (\d+)/100000", output)]
    assert max(steps, default=0) < 20, output[-3000:]


def _a_port_that_answers_but_never_joins():
    """A listening socket that accepts and ignores: what a worker that stopped after starting, or an address that is
    not a worker's, looks like to TensorFlow."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def test_a_peer_that_answers_but_never_joins_fails_joining_within_the_peer_timeout(synthetic_data, tmp_path):
    from components.train.launch_local import free_ports

    listener, silent_peer = _a_port_that_answers_but_never_joins()
    addresses = [f"127.0.0.1:{free_ports(1)[0]}", silent_peer]
    config = tiny_train_config(synthetic_data, tmp_path / "model", workers=2, peer_timeout_seconds=4)
    try:
        started = time.monotonic()
        completed = subprocess.run(
            train_command(config), cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
            env=_worker_environment(addresses, 0),
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    errors = [line for line in completed.stderr.splitlines() if " ERROR " in line]
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert len(errors) == 1 and re.search(
        rf"worker-0: the cluster did not form within 4 s: worker-1 \({silent_peer}\) answered on their ports but "
        "never joined",
        errors[0],
    ), completed.stderr[-3000:]
    assert elapsed < 45, f"joining took {elapsed:.0f} s with a 4 s peer timeout"
    assert not list((tmp_path / "model").glob("ckpt-*"))


def test_sigterm_while_the_cluster_forms_exits_143_promptly(synthetic_data, tmp_path):
    """TensorFlow holds the GIL while it waits for a peer to join and swallows SIGTERM there: the supervisor
    answers for the worker."""
    from components.train.launch_local import free_ports

    listener, silent_peer = _a_port_that_answers_but_never_joins()
    addresses = [f"127.0.0.1:{free_ports(1)[0]}", silent_peer]
    config = tiny_train_config(synthetic_data, tmp_path / "model", workers=2, peer_timeout_seconds=600)
    worker = LiveProcess(config, TF_CONFIG=json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    ))  # fmt: skip
    try:
        worker.wait_for(r"worker-0: all 2 workers have started")
        time.sleep(2)  # inside TensorFlow's wait for the peer to join
        worker.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code, output = worker.finish(timeout=60)
    finally:
        listener.close()
    assert code == 143, output[-3000:]
    assert time.monotonic() - started < 15
    assert "SIGTERM received: passing it on to worker-0 (joining)" in output


def test_a_paused_worker_is_named_not_the_healthy_one_waiting_for_it(synthetic_data, tmp_path):
    config = tiny_train_config(
        synthetic_data, tmp_path / "model", workers=2, train_steps=100000, log_every_steps=10,
        worker_failure_timeout_seconds=5,
    )  # fmt: skip
    live = LiveProcess(config)
    pid = int(live.wait_for(r"started worker-1 \(pid (\d+)\)").group(1))
    live.wait_for(r"\[worker-0\].*step 10/")
    os.killpg(pid, signal.SIGSTOP)  # the whole worker, as Ctrl-Z in its own terminal would
    paused_at = time.monotonic()
    code, output = live.finish(timeout=120)
    assert code == 1, output[-3000:]
    assert time.monotonic() - paused_at < 60
    errors = [line for line in output.splitlines() if " ERROR " in line and not line.startswith("[worker")]
    assert len(errors) == 1 and re.search(rf"worker-1 \(pid {pid}\) is stopped \(paused", errors[0]), output[-3000:]
    assert not _alive(pid)


def test_two_workers_train_the_muon_recipe_to_identical_weights(synthetic_data, tmp_path):
    """Muon acts on the all-reduced gradient in the cross-replica update: both workers end bit-identical."""
    config = tiny_train_config(
        synthetic_data, tmp_path / "muon", preset="airbench94_muon", width_multiplier=0.125, batch_size=32,
        learning_rate_batch_size=32, workers=2, train_steps=3,
    )  # fmt: skip
    assert (config.optimizer, config.model) == ("muon", "airbench_muon")
    completed = run_training(config)
    assert completed.returncode == 0, completed.stderr[-3000:]
    digests = re.findall(r"\[(worker-\d)\].*weights sha256 ([0-9a-f]{64})", completed.stderr)
    assert len(digests) == 2 and digests[0][1] == digests[1][1], "the two workers ended with different weights"


def test_two_workers_leave_together_on_a_loaded_machine(synthetic_data, tmp_path):
    """The chief hosts the cluster's coordination service: it leaves last, after every worker has reached the leaving
    barrier, so no worker outlives the service and aborts on a refused heartbeat ("StartAbort UNAVAILABLE"), which
    a loaded machine made likely (a busy process beside each core)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        completed = run_training(tiny_train_config(synthetic_data, tmp_path / "model", workers=2, train_steps=4))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    assert not re.search(r"StartAbort|unhealthy|Failed to send RPC to coordination service", output), output[-3000:]
    assert "leaving without the others" not in output, output[-3000:]
