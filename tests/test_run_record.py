"""A local run's record (run.json): resuming a run with its own options, RESUME=last, and clean-runs by how runs
stand; a damaged record is refused naming the file."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shlex
import socket
import time
from pathlib import Path

import pytest

from pipeline import local_run, make, run_record
from pipeline.commands import CommandError
from pipeline.parameters import DEFAULT_OUTPUT_ROOT

PIPELINE = "cifar10-pipeline"
OWN = {"source": "/data/my-images", "workers": 1, "depth": 8, "train_steps": 400, "preset": "fast",
       "train_options": {"ema_decay": 0.999}, "promotion_root": "/data/models"}  # fmt: skip


def a_run(root: Path, stamp: str, state: str, pid: int | None = None, checkpoint: bool = True) -> Path:
    folder = root / f"{PIPELINE}-2026-11-25-{stamp}-000000"
    model_dir = folder / "launch-training-job-component" / "model"
    model_dir.mkdir(parents=True)
    if checkpoint:
        for name in ("ckpt-40.index", "ckpt-40.data-00000-of-00001"):
            (model_dir / name).write_bytes(b"x")
    record = run_record.RunRecord(
        parameters=OWN, runner="subprocess", state=state, pid=pid or 999_999, host=socket.gethostname(),
        started_at=time.time(),
    )  # fmt: skip
    run_record.write(folder, record)
    return folder


def test_a_resumed_run_goes_on_with_its_own_options_and_only_its_length_may_change(tmp_path):
    folder = a_run(tmp_path, "09-00-00", "interrupted")
    parameters, continued = local_run.resumed(PIPELINE, {}, tmp_path, folder.name)
    assert continued == folder
    assert {name: parameters[name] for name in OWN} == OWN, "not the demo's options: the run's own"
    assert parameters["model_dir"] == str(folder / "launch-training-job-component" / "model")
    longer, _ = local_run.resumed(PIPELINE, {"train_steps": 800}, tmp_path, folder.name)
    assert longer["train_steps"] == 800
    with pytest.raises(CommandError, match=r"depth was 8 in that run, 20 now; leave it out"):
        local_run.resumed(PIPELINE, {"depth": 20}, tmp_path, folder.name)


def test_resume_last_is_the_newest_interrupted_run_not_one_that_runs_or_finished(tmp_path):
    interrupted = a_run(tmp_path, "09-00-00", "interrupted")
    killed = a_run(tmp_path, "10-00-00", "running", pid=999_999)  # its process is gone: interrupted
    a_run(tmp_path, "11-00-00", "finished")
    running = a_run(tmp_path, "12-00-00", "running", pid=os.getpid())
    assert local_run.resumable_run(PIPELINE, tmp_path, "last") == killed
    with pytest.raises(CommandError, match=rf"{running.name} is still running \(pid {os.getpid()}\); stop it first"):
        local_run.resumable_run(PIPELINE, tmp_path, running.name)
    run_record.ended(killed, run_record.read(killed), "finished")
    assert local_run.resumable_run(PIPELINE, tmp_path, "last") == interrupted


def test_a_resumed_run_that_is_stopped_again_resumes_in_the_first_runs_model_directory(tmp_path):
    """A resumed run trains on in the earlier run's model directory; its own training step's folder stays empty.
    Stopped again, it is resumed from there, and what it says of itself names that directory."""
    first = a_run(tmp_path, "09-00-00", "interrupted")
    trained_in = first / "launch-training-job-component" / "model"
    parameters, _ = local_run.resumed(PIPELINE, {}, tmp_path, "last")
    second = a_run(tmp_path, "10-00-00", "interrupted", checkpoint=False)  # its own model folder: empty
    run_record.write(second, dataclasses.replace(run_record.read(second), parameters=parameters))
    (trained_in / "ckpt-60.index").write_bytes(b"x")  # the second run trained on, there
    assert local_run.model_directory_of(second) == trained_in
    assert local_run.resumable_run(PIPELINE, tmp_path, "last") == second
    again, continued = local_run.resumed(PIPELINE, {}, tmp_path, "last")
    assert continued == second and again["model_dir"] == str(trained_in)
    assert (
        f"interrupted at step 60 (its checkpoint is saved); continue with: make local-run OUTPUT={tmp_path} RESUME="
        in (local_run._interrupted(second))
    )


@pytest.mark.parametrize("where", ["outputs", "elsewhere/my outputs"])
def test_the_command_an_interrupted_run_prints_continues_it_from_where_it_was_run(tmp_path, monkeypatch, where):
    """The line a stopped run ends with is a command to copy: run as printed (make's words, or the CLI's) from the
    folder the run was started in, it finds that run, under the default OUTPUT or another (a path with a space)."""
    monkeypatch.chdir(tmp_path)
    folder = a_run(tmp_path / where, "09-00-00", "interrupted")
    said = local_run._interrupted(folder)
    make_line = re.search(r"continue with: (make .+?) \(the same options\)", said).group(1)
    words = shlex.split(make_line)
    assert words[:2] == ["make", "local-run"]
    given, rest = make.parse_assignments(words[2:])
    assert rest == [] and make.problems(["local-run"], given) == []
    [command] = make.commands_of("local-run", make.Values(given, environment={}))
    cli_line = re.search(r"or python -m pipeline.pipeline (local-run .+)$", said).group(1)
    for arguments in (command.arguments, shlex.split(cli_line)):
        options = dict(itertools.pairwise(arguments))
        output_root = Path(options.get("--output-root", str(DEFAULT_OUTPUT_ROOT)))
        assert local_run.resumable_run(PIPELINE, output_root.resolve(), options["--resume"]) == folder


def test_an_output_folder_moved_elsewhere_resumes_its_runs_there(tmp_path):
    """What a run records inside the output folder (a resumed run's model directory in an earlier run's folder, the
    promotion root beside the runs) is recorded relative to it: moved, the runs resume and promote at the new place."""
    old, new = tmp_path / "old", tmp_path / "new"
    first = a_run(old, "09-00-00", "interrupted")
    parameters, _ = local_run.resumed(PIPELINE, {}, old, "last")
    parameters["promotion_root"] = str(old / "models")
    second = a_run(old, "10-00-00", "interrupted", checkpoint=False)
    run_record.write(second, dataclasses.replace(run_record.read(second), parameters=parameters))
    recorded = json.loads((second / run_record.RECORD).read_text())
    assert recorded["parameters"]["model_dir"] == f"../{first.name}/launch-training-job-component/model"
    assert (
        recorded["relative"] == ["model_dir", "promotion_root"]
        and recorded["parameters"]["source"] == "/data/my-images"
    )
    os.rename(old, new)
    again, continued = local_run.resumed(PIPELINE, {}, new, "last")
    assert continued == new / second.name
    assert again["model_dir"] == str(new / first.name / "launch-training-job-component" / "model")
    assert again["promotion_root"] == str(new / "models")


def test_clean_runs_keeps_running_and_interrupted_runs_unless_told(tmp_path, caplog):
    interrupted = a_run(tmp_path, "09-00-00", "interrupted")
    finished = a_run(tmp_path, "10-00-00", "finished")
    running = a_run(tmp_path, "11-00-00", "running", pid=os.getpid())
    with caplog.at_level("INFO", logger="pipeline"):
        assert local_run.clean_runs(PIPELINE, tmp_path) == [finished]
    assert f"kept {interrupted.name}: interrupted, can be resumed (make clean-runs OUTPUT={tmp_path} ALL=1" in (
        caplog.text
    )
    assert f"kept {running.name}: still running" in caplog.text
    assert local_run.clean_runs(PIPELINE, tmp_path, interrupted_too=True) == [interrupted]
    assert running.is_dir()


def test_clean_runs_keeps_the_prepared_dataset_a_live_run_may_be_reading(tmp_path, caplog):
    """`make clean-runs KEEP=1` while a run trains on the dataset an earlier run prepared (kfp.local's cache handed
    it over): the earlier run goes but its dataset, which a clean-runs after the live run ends removes."""
    earlier = a_run(tmp_path, "09-00-00", "finished")
    dataset = earlier / local_run.PREPARE_TASK / "dataset"
    dataset.mkdir(parents=True)
    (dataset / "manifest.json").write_text("{}")
    running = a_run(tmp_path, "11-00-00", "running", pid=os.getpid())
    with caplog.at_level("INFO", logger="pipeline"):
        assert local_run.clean_runs(PIPELINE, tmp_path, keep=1) == [earlier]
    assert (dataset / "manifest.json").read_text() == "{}"
    assert sorted(path.name for path in earlier.iterdir()) == [local_run.PREPARE_TASK]
    assert f"removed {earlier.name} but its prepared dataset, which the running {running.name} may be reading" in (
        caplog.text
    )
    run_record.ended(running, run_record.read(running), "finished")  # the live run ended
    local_run.clean_runs(PIPELINE, tmp_path, keep=1)
    assert not earlier.exists() and running.is_dir()


@pytest.mark.parametrize(
    "content",
    [b"[]", b"{", b'{"state": "running"}', b"x" * (run_record.MAX_RECORD_BYTES + 1)],
    ids=["not an object", "not JSON", "fields missing", "too large"],
)
def test_a_damaged_record_is_refused_naming_the_file(tmp_path, content):
    folder = a_run(tmp_path, "09-00-00", "interrupted")
    (folder / run_record.RECORD).write_bytes(content)
    with pytest.raises(ValueError, match=rf"{folder / run_record.RECORD}: "):
        run_record.read(folder)


def test_a_record_with_a_value_out_of_its_kind_is_refused(tmp_path):
    folder = a_run(tmp_path, "09-00-00", "interrupted")
    document = dataclasses.asdict(run_record.read(folder)) | {"pid": True}
    (folder / run_record.RECORD).write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"run\.json: not a valid run record: pid: "):
        run_record.read(folder)


CLUSTER_VALUES = {
    "gpus_per_worker": "1", "worker_cpu": "2", "worker_memory": "8Gi", "worker_image": "registry.example.com/t:1",
    "image_pull_secret": "regcred", "queue_name": "team-queue", "train_step_gpus": "1", "train_step_cpus": "2",
    "train_step_memory": "8Gi", "object_store_secret": "store-keys", "prepare_step_memory": "16Gi",
}  # fmt: skip


@pytest.mark.parametrize("pipeline_word", [None, "sweep"])
def test_a_clusters_pod_setting_given_to_a_local_run_is_refused_not_ignored(tmp_path, capfd, pipeline_word):
    """A worker pod's GPUs, memory or image, the training step's pod resources, a Kubernetes secret or a Kueue queue
    mean nothing to a local run (its workers are processes; kfp.local sets no resources): refused in one line naming
    the option, before anything is made."""
    from pipeline import commands
    from pipeline.pipeline import pipeline_named

    assert set(CLUSTER_VALUES) == set(local_run.CLUSTER_ONLY_PARAMETERS)
    pipeline = pipeline_named(pipeline_word)
    for name, value in CLUSTER_VALUES.items():
        option = f"--{name.replace('_', '-')}"
        output = tmp_path / name
        assert commands.main(pipeline, ["local-run", "--output-root", str(output), option, value]) == 2
        (line,) = [line for line in capfd.readouterr().err.splitlines() if " ERROR " in line]
        assert f"ERROR pipeline: {option}: a setting of the pods a cluster runs; a local run's steps" in line
        assert not output.exists()


def test_a_synthetic_dataset_size_given_with_another_source_is_refused(tmp_path, capfd):
    from pipeline import commands
    from pipeline.pipeline import pipeline_named

    images = tmp_path / "images"
    images.mkdir()
    options = ["--synthetic-train-per-class", "10"]
    code = commands.main(pipeline_named(None), ["local-run", "--output-root", str(tmp_path / "out"), "--source",
                                                str(images), *options])  # fmt: skip
    assert code == 2 and not (tmp_path / "out").exists()
    assert f"synthetic_train_per_class: it sizes the synthetic dataset, and the source is {images}" in (
        capfd.readouterr().err
    )
    assert commands.main(pipeline_named(None), ["run", "--host", "http://127.0.0.1:9", *options]) == 2
    assert "and the source is https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in capfd.readouterr().err
