"""Image names and builds without an engine: content-derived tags, the build command, RUNNER=docker's checks.
The images themselves are built and run by tests/test_images.py (make test-images)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from components import images
from images import build as images_build
from pipeline import local_run
from pipeline.parameters import CommandError

REPOSITORY = Path(__file__).resolve().parents[1]


def copy_of_build_inputs(destination: Path) -> Path:
    for path in images.build_inputs(REPOSITORY):
        target = destination / path.relative_to(REPOSITORY)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return destination


def test_the_tag_changes_with_what_goes_into_the_images_and_only_with_it(tmp_path):
    """KFP's cache keys on the image string: new code must never be given results computed by old code."""
    repository = copy_of_build_inputs(tmp_path / "repository")
    tag = images.content_tag.__wrapped__(repository)
    assert tag.startswith(images.VERSION + "-") and tag == images.content_tag.__wrapped__(repository)

    (repository / "components" / "__pycache__").mkdir(exist_ok=True)
    (repository / "components" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")
    assert images.content_tag.__wrapped__(repository) == tag, "byte-code caches are not part of the images"
    (repository / "components" / "train" / ".ruff_cache").mkdir()
    (repository / "components" / "train" / ".ruff_cache" / "CACHEDIR.TAG").write_text("cache")
    (repository / "components" / ".model.py.swp").write_bytes(b"editor")
    assert images.content_tag.__wrapped__(repository) == tag, "hidden files are not part of the images"

    model = repository / "components" / "common" / "model.py"
    model.write_text(model.read_text() + "\n# a change\n")
    changed = images.content_tag.__wrapped__(repository)
    assert changed != tag
    (repository / "constraints-gpu.txt").write_text("tensorflow==2.21.0\n")
    assert images.content_tag.__wrapped__(repository) not in (tag, changed)


def test_no_build_input_is_empty():
    """An empty file (a bare __init__.py) is the kind a copy or archive may drop; the tag must not hang on one."""
    assert [str(path) for path in images.build_inputs(REPOSITORY) if path.stat().st_size == 0] == []


def test_the_compiled_pipeline_runs_each_step_in_the_content_tagged_image_of_its_kind():
    spec = next(yaml.safe_load_all((REPOSITORY / "pipeline" / "pipeline.yaml").read_text()))
    used = {label: executor["container"]["image"] for label, executor in spec["deploymentSpec"]["executors"].items()}
    tag = images.content_tag()
    assert set(used.values()) == {f"{images.DEFAULT_REGISTRY}/cpu:{tag}", f"{images.DEFAULT_REGISTRY}/gpu:{tag}"}
    assert used["exec-train-component"].endswith(f"/gpu:{tag}")
    assert used["exec-launch-training-job-component"].endswith(f"/cpu:{tag}")
    assert used["exec-delete-training-job-component"].endswith(f"/cpu:{tag}")
    assert used["exec-prepare-data-component"].endswith(f"/cpu:{tag}")


def test_registry_and_tag_can_be_overridden(monkeypatch):
    monkeypatch.setenv("CIFAR10_PIPELINE_REGISTRY", "registry.example.com/team/")
    monkeypatch.setenv("CIFAR10_PIPELINE_TAG", "v7")
    assert images.image("evaluate") == "registry.example.com/team/cpu:v7"
    assert images.image("train") == "registry.example.com/team/gpu:v7"
    with pytest.raises(ValueError, match="unknown stage 'serve'"):
        images.image("serve")


def test_build_command_passes_the_base_the_kind_and_the_ca_bundle_as_a_secret(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("certificates")
    request = images_build.BuildRequest("gpu", "registry.example.com/team/gpu:v7", "debian-python:12", bundle)
    command = request.command("docker")
    assert command[:2] == ["docker", "build"] and command[-1] == str(REPOSITORY)
    for argument in ("BASE_IMAGE=debian-python:12", "ACCELERATOR=gpu"):
        assert command[command.index(argument) - 1] == "--build-arg"
    assert command[command.index("--secret") + 1] == f"id=ca_bundle,src={bundle}"
    assert "--network" not in command and "--network" in request.command("podman", host_network=True)
    assert images_build.default_base_image().startswith("python:3.11.15-slim-bookworm@sha256:")


def test_without_an_engine_make_images_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither docker nor podman can be found
    assert images_build.main(["--kinds", "cpu"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        "make images: no container engine can build here: docker is not installed; podman is not installed (make "
        "images ENGINE=docker or ENGINE=podman picks one; docs/containers.md)"
    )


def fake_engine(
    folder: Path, name: str, buildx: bool = True, client: str = "28.2.2", server: str = "Engine", bridge: bool = True
) -> None:
    """A stand-in CLI on PATH, answering as Docker's does: `info` (as a Docker CLI pointed at podman's API by
    DOCKER_HOST does too); `buildx version` only when the buildx component is there; `version --format` with the
    client's version or the server's components (podman's Docker API names itself there); `network inspect bridge`
    when the engine has a bridge network."""
    script = folder / name
    answer = "echo v0.17; exit 0" if buildx else "echo unknown command buildx >&2; exit 1"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = info ]; then echo ok; exit 0; fi\n'
        f'if [ "$1" = buildx ]; then {answer}; fi\n'
        f'if [ "$1" = network ]; then exit {0 if bridge else 1}; fi\n'
        f'if [ "$1" = version ] && [ "$3" = "{{{{.Client.Version}}}}" ]; then echo {client}; exit 0; fi\n'
        f'if [ "$1" = version ]; then echo \'[{{"Name":"{server}","Version":"x"}}]\'; exit 0; fi\n'
        "exit 3\n"
    )
    script.chmod(0o755)


def test_make_images_picks_an_engine_that_can_build_or_names_the_engine_to_use(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_engine(tmp_path, "docker", buildx=False)
    with pytest.raises(images_build.BuildError, match=r"docker answers but cannot build: its buildx component"):
        images_build.find_engine()
    fake_engine(tmp_path, "podman")
    assert images_build.find_engine() == "podman"  # not the Docker CLI that would fail on BuildKit
    fake_engine(tmp_path, "docker", buildx=True, server="Podman Engine")  # DOCKER_HOST at podman's Docker API
    assert images_build.find_engine() == "podman"
    with pytest.raises(images_build.BuildError, match=r"docker answers through podman's Docker API \(DOCKER_HOST\)"):
        images_build.find_engine("docker")
    fake_engine(tmp_path, "docker", buildx=False, client="20.10.24+dfsg1")  # Debian 12: BuildKit built into the CLI
    assert images_build.find_engine() == "docker"
    fake_engine(tmp_path, "docker", buildx=True)
    assert images_build.find_engine() == "docker"


def test_builds_use_the_hosts_network_where_the_engine_has_no_bridge(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_engine(tmp_path, "docker")
    assert not images_build.needs_host_network("docker")
    fake_engine(tmp_path, "docker", bridge=False)  # dockerd --bridge=none: BuildKit's default network is missing
    assert images_build.needs_host_network("docker") and images_build.needs_host_network("podman")


def test_docker_runner_refuses_local_paths_it_cannot_mount(tmp_path):
    output = tmp_path / "outputs"
    local_run.check_paths_are_mounted({"source": "synthetic", "promotion_root": str(output / "models")}, output)
    local_run.check_paths_are_mounted({"source": "s3://bucket/cifar-10-python.tar.gz"}, output)
    with pytest.raises(CommandError, match=r"^source: .*archive.tar.gz is outside .*outputs.*copy it under"):
        local_run.check_paths_are_mounted({"source": str(tmp_path / "archive.tar.gz")}, output)
