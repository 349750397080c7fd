"""Build the project's images with Docker or podman, whichever answers: `make images` (python -m images.build).

    python -m images.build [--kinds cpu gpu] [--base-image IMAGE] [--ca-bundle FILE] [--stand-in-base] [--push]

The references come from components/images.py (registry, content-derived tag). `--ca-bundle` passes a CA bundle as
a build secret, for networks that re-sign TLS; it is mounted for the pip step only and stored in no layer.
`--stand-in-base` builds a base image from Debian packages (debootstrap, as root) for machines that cannot pull
the pinned default, and builds on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from components.common import exit_codes, processes
from components.images import KINDS, REPOSITORY, VERSION, image_of_kind, image_tag

logger = logging.getLogger("images")

DOCKERFILE = REPOSITORY / "images" / "Dockerfile"
STAND_IN_BASE = "localhost/cifar10-pipeline-base:bookworm"
STAND_IN_PACKAGES = "python3,python3-venv,ca-certificates,passwd"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class BuildError(Exception):
    """A build that cannot start or failed; the message says which and why."""


def engine_problem(engine: str) -> str | None:
    """Why `engine` cannot build or run images here, or None when it answers."""
    if shutil.which(engine) is None:
        return f"{engine} is not installed"
    try:
        completed = processes.run([engine, "info"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return f"`{engine} info` did not answer within 60 s"
    if completed.returncode != 0:
        reason = (completed.stderr or completed.stdout).strip().splitlines()
        return f"`{engine} info` failed: {reason[-1] if reason else 'no engine'}"
    if engine != "docker":
        return None
    # The Dockerfile's build secret needs BuildKit, in the CLI and in the engine: podman's Docker API (where
    # DOCKER_HOST may point the Docker CLI, for RUNNER=docker) answers `info` but has no BuildKit to build with.
    if "podman" in (_answers(["docker", "version", "--format", "{{json .Server.Components}}"]) or "").lower():
        return "docker answers through podman's Docker API (DOCKER_HOST), which cannot build with BuildKit"
    if not _docker_builds():
        return "docker answers but cannot build: its buildx component (BuildKit) is missing (install docker-buildx)"
    return None


def _docker_builds() -> bool:
    """Whether the Docker CLI can build with BuildKit: through its buildx component, or built in (CLIs before 23.0,
    such as Debian 12's docker.io 20.10; 23.0 moved BuildKit into buildx and fails without it)."""
    if _answers(["docker", "buildx", "version"]) is not None:
        return True
    version = _answers(["docker", "version", "--format", "{{.Client.Version}}"]) or ""
    major = version.strip().split(".", 1)[0]
    return major.isdigit() and int(major) < 23


def _answers(command: list[str]) -> str | None:
    """What `command` printed when it succeeded within a minute, else None."""
    try:
        completed = processes.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout if completed.returncode == 0 else None


def needs_host_network(engine: str) -> bool:
    """Builds reach the package registry as the host does: always with podman, and with a Docker engine that has no
    bridge network (started with --bridge=none, where BuildKit's default network fails: 'network bridge not
    found')."""
    return engine == "podman" or _answers(["docker", "network", "inspect", "bridge"]) is None


def find_engine(preferred: str | None = None) -> str:
    """`preferred`, or the first of docker and podman that can build; the error names each one's problem and the
    ENGINE= to use."""
    candidates = [preferred] if preferred else ["docker", "podman"]
    problems = {}
    for engine in candidates:
        problem = engine_problem(engine)
        if problem is None:
            if preferred is None and problems:
                logger.info("building with %s (%s)", engine, "; ".join(problems.values()))
            return engine
        problems[engine] = problem
    hint = "" if preferred else " (make images ENGINE=docker or ENGINE=podman picks one; docs/containers.md)"
    raise BuildError("no container engine can build here: " + "; ".join(problems.values()) + hint)


def default_base_image() -> str:
    """The Dockerfile's own default (a digest-pinned python image)."""
    for line in DOCKERFILE.read_text().splitlines():  # reader: the repository's own Dockerfile
        if line.startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1]
    raise BuildError(f"{DOCKERFILE}: no ARG BASE_IMAGE= line")


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    kind: str
    reference: str
    base_image: str
    ca_bundle: Path | None = None

    def command(self, engine: str, host_network: bool = False) -> list[str]:
        command = [engine, "build", "--file", str(DOCKERFILE), "--tag", self.reference]
        command += ["--build-arg", f"BASE_IMAGE={self.base_image}", "--build-arg", f"ACCELERATOR={self.kind}"]
        if self.ca_bundle is not None:
            command += ["--secret", f"id=ca_bundle,src={self.ca_bundle}"]
        if host_network:
            command += ["--network", "host"]
        return [*command, str(REPOSITORY)]


def release_reference(reference: str) -> str:
    """The same image under the release tag (VERSION), for manifests that name a release, not a content."""
    return f"{reference.rsplit(':', 1)[0]}:{VERSION}"


def build(engine: str, request: BuildRequest) -> dict:
    """Build one image (also tagged with the release); returns its reference, build seconds and size."""
    logger.info("building %s (%s image) on %s from %s", request.reference, request.kind, engine, request.base_image)
    started = time.monotonic()
    environment = {**os.environ, "DOCKER_BUILDKIT": "1"}  # build secrets need BuildKit on Docker
    completed = processes.run(request.command(engine, needs_host_network(engine)), env=environment)
    seconds = time.monotonic() - started
    if completed.returncode != 0:
        raise BuildError(f"building {request.reference} failed (exit {completed.returncode}); see the log above")
    processes.run([engine, "tag", request.reference, release_reference(request.reference)], check=True)
    size = image_size(engine, request.reference)
    logger.info("built %s in %.0f s: %.2f GB", request.reference, seconds, size / 1e9)
    return {"image": request.reference, "kind": request.kind, "seconds": round(seconds), "bytes": size}


def image_size(engine: str, reference: str) -> int:
    completed = processes.run(
        [engine, "image", "inspect", "--format", "{{.Size}}", reference], capture_output=True, text=True, check=True
    )
    return int(completed.stdout.strip())


def image_exists(engine: str, reference: str) -> bool:
    return processes.run([engine, "image", "inspect", reference], capture_output=True).returncode == 0


def can_pull(engine: str, reference: str) -> bool:
    if image_exists(engine, reference):
        return True
    logger.info("pulling %s", reference)
    return processes.run([engine, "pull", reference], capture_output=True, timeout=900).returncode == 0


def build_stand_in_base(engine: str, reference: str = STAND_IN_BASE) -> str:
    """A base image from Debian packages (bookworm, python3 and its venv module), when the default cannot be pulled.
    Needs root (debootstrap) and the Debian mirror."""
    if image_exists(engine, reference):
        return reference
    if shutil.which("debootstrap") is None:
        raise BuildError("--stand-in-base needs debootstrap (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="cifar10-pipeline-base-") as folder:
        root = Path(folder) / "rootfs"
        logger.info("debootstrap bookworm into %s", root)
        processes.run(
            ["debootstrap", "--variant=minbase", f"--include={STAND_IN_PACKAGES}", "bookworm", str(root)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        archive = processes.start(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        processes.run([engine, "import", "-", reference], stdin=archive.stdout, check=True, stdout=subprocess.DEVNULL)
        if archive.wait() != 0:
            raise BuildError(f"tar of {root} failed")
    logger.info("stand-in base image: %s", reference)
    return reference


def build_images(
    kinds: list[str], engine: str, base_image: str | None, ca_bundle: Path | None, stand_in_base: bool
) -> list[dict]:
    if stand_in_base:
        base_image = build_stand_in_base(engine)
    base_image = base_image or default_base_image()
    if ca_bundle is not None and not ca_bundle.is_file():
        raise BuildError(f"--ca-bundle: {ca_bundle} is not a file")
    return [build(engine, BuildRequest(kind, image_of_kind(kind), base_image, ca_bundle)) for kind in kinds]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m images.build", description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which images (default: both)")
    parser.add_argument(
        "--engine", choices=("docker", "podman"), help="default: the first of docker, podman that answers"
    )
    parser.add_argument("--base-image", help="default: the Dockerfile's digest-pinned python image")
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        default=SYSTEM_CA_BUNDLE if SYSTEM_CA_BUNDLE.is_file() else None,
        help="a CA bundle for pip, passed as a build secret, stored in no layer (default: this machine's, "
        f"{SYSTEM_CA_BUNDLE}, which also holds a network's TLS re-signing authority when one is installed)",
    )
    parser.add_argument("--stand-in-base", action="store_true", help="build on a base made from Debian packages")
    parser.add_argument("--push", action="store_true", help="push each image after building it")
    parser.add_argument("--print-references", action="store_true", help="print the image references and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # REGISTRY and TAG name images the kubelet can pull, before anything is built
        references = {kind: image_of_kind(kind) for kind in arguments.kinds}
    except ValueError as error:
        print(f"make images: {error}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if arguments.print_references:
        print(json.dumps(references))
        return 0
    try:
        engine = find_engine(arguments.engine)
        built = build_images(
            arguments.kinds, engine, arguments.base_image, arguments.ca_bundle, arguments.stand_in_base
        )
        for image in built if arguments.push else []:
            for reference in (image["image"], release_reference(image["image"])):
                processes.run([engine, "push", reference], check=True)
    except (BuildError, subprocess.CalledProcessError) as error:
        print(f"make images: {error}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    print(json.dumps({"engine": engine, "tag": image_tag(), "images": built}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
