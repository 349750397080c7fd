"""RUNNER=docker without an engine: the steps' user may write into everything the host prepares for a step.

`make local-run RUNNER=docker` runs each step in its image as another user than the host's when the host is root
(the images' 10001). These tests play the engine: the first container start is intercepted, and the steps' user's
access is checked, by permission bits, on the folders a step writes into: the run's folder (where each step makes
its own), the promotion root, and a resumed run's model directory, also when earlier runs left them owned by the
host's root. As a non-root user the steps run with the user's own IDs, so the same checks hold trivially.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest

from pipeline import local_run
from pipeline.parameters import CommandError
from pipeline.step_user import IMAGE_USER, StepUser, engine_is_rootless, may_write, step_user_for
from pipeline.training_pipeline import cifar10_pipeline

PARAMETERS = {"source": "synthetic", "workers": 1, "train_steps": 4, "depth": 8, "synthetic_train_per_class": 4}


class FakeEngine:
    """What the Docker SDK is asked for, answered without an engine; the first container start is recorded and
    fails, so the run ends there (everything the host prepares is prepared before the first step)."""

    def __init__(self):
        self.started: list[dict] = []
        self.images = types.SimpleNamespace(list=lambda: [types.SimpleNamespace(tags=["any:latest"], attrs={})],
                                            pull=lambda image: None)  # fmt: skip
        self.containers = types.SimpleNamespace(run=self.run)
        self.api = types.SimpleNamespace(timeout=60)

    def from_env(self, *_arguments, **_keywords):
        return self

    def info(self):
        return {"SecurityOptions": ["name=seccomp,profile=default"]}

    def version(self):
        return {"Components": [{"Name": "Engine"}]}

    def close(self):
        pass

    def run(self, image, command, volumes, **run_arguments):
        executor_input = json.loads(command[command.index("--executor_input") + 1])
        self.started.append({"image": image, "volumes": volumes, "executor_input": executor_input, **run_arguments})
        return types.SimpleNamespace(
            id=f"container-{len(self.started)}",
            logs=lambda **_keywords: iter([b"the step failed\n"]),
            reload=lambda: None,
            status="exited",
            attrs={"State": {"Status": "exited", "ExitCode": 1}},
            remove=lambda force: None,
        )


@pytest.fixture
def engine(monkeypatch):
    import docker

    fake = FakeEngine()
    monkeypatch.setattr(docker, "from_env", fake.from_env)
    monkeypatch.setattr(local_run, "docker_engine_problem", lambda: None)
    monkeypatch.setattr(local_run, "check_images_are_built", lambda: None)
    return fake


def user_of(started: dict) -> StepUser:
    uid, gid = (int(part) for part in started["user"].split(":"))
    return StepUser(uid, gid)


def nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def step_output_folders(started: dict) -> list[Path]:
    """Where the step will write: its output file's and output artifacts' folders (made by the step itself)."""
    outputs = started["executor_input"]["outputs"]
    paths = [Path(outputs["outputFile"])]
    for artifacts in outputs.get("artifacts", {}).values():
        paths += [Path(artifact["uri"]) for artifact in artifacts["artifacts"]]
    return paths


def test_the_steps_user_is_the_images_user_as_root_ones_own_as_a_user_and_root_on_a_rootless_engine():
    assert step_user_for(rootless=False, host_uid=0, host_gid=0).docker_user == f"{IMAGE_USER}:{IMAGE_USER}"
    assert step_user_for(rootless=False, host_uid=1000, host_gid=100).run_arguments() == {"user": "1000:100"}
    rootless = step_user_for(rootless=True, host_uid=1000, host_gid=100)
    assert rootless.run_arguments() == {"user": "0:0"} and (rootless.uid, rootless.gid) == (1000, 100)
    # What each engine's `info` says (trimmed), as they answered here.
    podman_rootless = {"Driver": "vfs", "SecurityOptions": ["name=seccomp,profile=default"], "Rootless": True}
    docker_rootless = {"SecurityOptions": ["name=seccomp,profile=default", "name=rootless"]}
    podman_as_root = {"SecurityOptions": ["name=seccomp,profile=default"], "Rootless": False}
    docker_as_root = {"SecurityOptions": ["name=seccomp,profile=default"]}
    assert engine_is_rootless(podman_rootless) and engine_is_rootless(docker_rootless)
    assert not engine_is_rootless(podman_as_root) and not engine_is_rootless(docker_as_root)


def test_permission_bits_decide_the_steps_access():
    folder = os.stat_result((0o40755, 0, 0, 0, 0, 0, 0, 0, 0, 0))  # root's, 755
    assert not may_write(folder, IMAGE_USER, {IMAGE_USER}) and may_write(folder, 0, {0})
    shared = os.stat_result((0o41777, 0, 0, 0, 0, 0, 0, 0, 0, 0))  # like /tmp
    assert may_write(shared, IMAGE_USER, {IMAGE_USER})
    own = os.stat_result((0o40700, 0, 0, 0, IMAGE_USER, IMAGE_USER, 0, 0, 0, 0))
    assert may_write(own, IMAGE_USER, {IMAGE_USER}) and not may_write(own, 1000, {1000})


def test_the_first_step_may_write_everything_the_host_prepared(tmp_path, engine):
    output_root = tmp_path / "outputs"
    with pytest.raises(local_run.RunFailedError, match=r"the run failed at fingerprint the source"):
        local_run.local_run(cifar10_pipeline, dict(PARAMETERS), output_root, runner="docker")
    # the steps that need nothing of another: the fingerprint and the clean-up (the warm start waits for the data)
    assert len(engine.started) == 2
    (run_folder,) = local_run.run_folders(cifar10_pipeline.name, output_root)
    for started in engine.started:
        user = user_of(started)
        expected = IMAGE_USER if os.getuid() == 0 else os.getuid()
        assert user.uid == expected, "as root the steps run as the images' user, never root"
        assert started["read_only"] is True
        for path in step_output_folders(started):
            folder = nearest_existing(path)
            assert run_folder in path.parents
            assert user.may_write(folder), f"the step cannot create {path}: {user.problems(folder, recursive=False)}"


def test_a_resumed_run_and_a_promotion_root_left_by_root_are_handed_to_the_steps(tmp_path, engine):
    """An earlier run (the subprocess runner, as the host's user) left its model directory and the promotion root;
    a RUNNER=docker run resuming it must be able to write both."""
    output_root = tmp_path / "outputs"
    earlier = output_root / "cifar10-pipeline-2026-11-25-09-00-00-000000"
    model_dir = earlier / "launch-training-job-component" / "model"
    (model_dir / "train").mkdir(parents=True)
    for name in ("ckpt-4.index", "ckpt-4.data-00000-of-00001", "checkpoint", "config.json"):
        (model_dir / name).write_bytes(b"{}")
    promoted = output_root / "models" / "1"
    promoted.mkdir(parents=True)
    for folder in (output_root, earlier, model_dir, model_dir / "train", promoted.parent, promoted):
        folder.chmod(0o755)
    with pytest.raises(local_run.RunFailedError):
        local_run.local_run(cifar10_pipeline, dict(PARAMETERS), output_root, runner="docker", resume=str(earlier))
    user = user_of(engine.started[0])
    assert user.problems(model_dir) == [] and user.problems(output_root / "models") == []
    assert all(user.may_write(nearest_existing(path)) for path in step_output_folders(engine.started[0]))


@pytest.mark.parametrize("tag", ["", "v1"])
def test_images_not_built_are_named_with_the_command_that_builds_them(monkeypatch, tag):
    """RUNNER=docker before `make images` (or with another TAG than the images were built with): one line naming
    the missing image and the make command that builds it with the tag the run would use."""
    import docker

    from components.images import image

    class Images:
        def get(self, reference):
            raise docker.errors.ImageNotFound(reference)

    monkeypatch.setattr(docker, "from_env", lambda timeout: types.SimpleNamespace(images=Images()))
    monkeypatch.setenv("CIFAR10_PIPELINE_TAG", tag)
    with pytest.raises(CommandError) as refused:
        local_run.check_images_are_built()
    said = str(refused.value)
    assert said.startswith(f"{image('evaluate').rsplit(':', 1)[0]}:")  # the first missing image, named
    assert (f"make images TAG={tag} builds it" in said) if tag else ("run make images first, or give the TAG" in said)
