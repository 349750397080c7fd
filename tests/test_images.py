"""The container images, built and run for real: `make test-images` (not part of `make test`: about 25 minutes).

Builds both images with whichever engine answers (Docker or podman), on the pinned base when it can be pulled and
otherwise on a stand-in made from Debian packages, then runs the whole pipeline in them through kfp.local's
DockerRunner: every step's compiled KFP command in its image, as a non-root user, on a read-only root file system
with a writable /tmp. Where no engine answers, or none that can build, the tests fail saying why: this target exists
only to run them, and a pass that tested nothing would hide a broken container path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.images import REPOSITORY
from images import build as images_build
from pipeline import local_run
from pipeline.training_pipeline import cifar10_pipeline

pytestmark = pytest.mark.images
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def engine() -> str:
    try:
        return images_build.find_engine(os.environ.get("ENGINE") or None)
    except images_build.BuildError as error:
        pytest.fail(f"make test-images cannot run here: {error} (docs/containers.md says how to set one up)")


@pytest.fixture(scope="module")
def built(engine) -> list[dict]:
    default = images_build.default_base_image()
    stand_in = not images_build.can_pull(engine, default)
    built = images_build.build_images(
        ["cpu", "gpu"], engine, None, CA_BUNDLE if CA_BUNDLE.is_file() else None, stand_in_base=stand_in
    )
    print(json.dumps({"engine": engine, "stand_in_base": stand_in, "images": built}, indent=2))
    return built


@pytest.fixture(scope="module")
def docker_api(engine, tmp_path_factory):
    """A Docker API for kfp.local's DockerRunner: Docker's own, or podman's `podman system service`."""
    if local_run.docker_engine_problem() is None:
        yield
        return
    if engine != "podman":
        pytest.fail(
            f"make test-images cannot run the pipeline: no Docker API answers ({local_run.docker_engine_problem()})"
        )
    socket = tmp_path_factory.mktemp("podman") / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"])
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = f"unix://{socket}"
    try:
        deadline = time.monotonic() + 60
        while local_run.docker_engine_problem() is not None:
            assert time.monotonic() < deadline, (
                f"podman system service did not answer: {local_run.docker_engine_problem()}"
            )
            time.sleep(1)
        yield
    finally:
        service.terminate()
        service.wait(timeout=30)
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous


def test_images_hold_no_build_secret_and_run_as_a_non_root_user(engine, built):
    for image in built:
        completed = subprocess.run(
            [engine, "run", "--rm", "--read-only", image["image"], "sh", "-c",
             "id -u; test ! -e /run/secrets/ca_bundle && echo no-secret; python -c 'import components, kfp'"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert completed.stdout.split() == ["10001", "no-secret"], completed.stdout
        history = subprocess.run(
            [engine, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image["image"]],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "BEGIN CERTIFICATE" not in history


def containers_of_the_images(built) -> list[str]:
    import docker

    references = {image["image"] for image in built}
    client = docker.from_env(timeout=60)
    return [f"{container.short_id} ({container.status})" for container in client.containers.list(all=True)
            if set(container.image.tags) & references]  # fmt: skip


def test_whole_pipeline_runs_in_the_images_through_the_docker_runner(built, docker_api, tmp_path):
    """A run whose local-run is killed (kill -9) while it trains in its container leaves no container behind, and a
    checkpoint; resumed, it runs the whole pipeline, fingerprint -> prepare_data -> warm start -> train (2 local
    workers in one container) -> evaluate -> promote, each step's compiled KFP command in its own image."""
    parameters = {
        "source": "synthetic",
        "synthetic_train_per_class": 20,
        "workers": 2,
        "depth": 8,
        "batch_size": 32,
        "train_steps": 100_000,
        "accuracy_threshold": 0.2,
        "train_options": {"width_multiplier": 0.25, "log_every_steps": 10, "batch_norm_decay": 0.9},
    }
    output = tmp_path / "outputs"
    options = [f"--{name.replace('_', '-')}={json.dumps(value) if isinstance(value, dict) else value}"
               for name, value in parameters.items()]  # fmt: skip
    killed = subprocess.Popen(
        [sys.executable, "-m", "pipeline.pipeline", "local-run", "--runner", "docker", "--output-root", str(output),
         *options],
        cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines = []
    for line in killed.stdout:
        lines.append(line)
        print(line, end="")
        if re.search(r"train: step 20/100000 ", line):
            break
    assert killed.poll() is None, "".join(lines[-30:])
    assert containers_of_the_images(built), "the training step runs in its container"
    killed.kill()
    killed.wait(timeout=30)
    deadline = time.monotonic() + 300
    while containers_of_the_images(built) and time.monotonic() < deadline:
        time.sleep(2)
    assert containers_of_the_images(built) == [], "local-run's reaper stops and removes its steps' containers"
    (run_folder,) = local_run.run_folders(cifar10_pipeline.name, output)
    model = local_run.model_directory_of(run_folder)  # the launcher auto trains as local workers here
    assert model is not None and list(model.glob("ckpt-*.index")), "the workers saved a checkpoint on the way out"
    saved = max(int(path.name.split("-")[1].split(".")[0]) for path in model.glob("ckpt-*.index"))

    resumed = local_run.local_run(
        cifar10_pipeline, {"train_steps": saved + 10}, output, runner="docker", resume=str(run_folder)
    )
    assert resumed != run_folder
    assert f"ckpt-{saved} at step {saved}" in (resumed / local_run.RUN_LOG).read_text()
    summary = json.loads((model / "train_metrics.json").read_text())
    assert summary["step"] == saved + 10 and json.loads((model / "config.json").read_text())["workers"] == 2
    evaluation = json.loads((model / "eval_metrics.json").read_text())
    assert evaluation["blessed"] is True
    pointer = json.loads((output / "models" / "current.json").read_text())
    assert pointer["version"] == 1 and pointer["state"] == "ready"
    assert (Path(pointer["saved_model"]) / "saved_model.pb").is_file()
    user = local_run.docker_step_user()
    assert (model / "train_metrics.json").stat().st_uid == user.uid  # 10001 as root, else one's own IDs
    assert user.uid != 0  # never root, but a rootless engine's root, which is the user who ran make
    shutil.rmtree(output)  # what the steps left is removable by whoever ran make
