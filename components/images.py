"""The container images, named in this one place.

Two images, both built from images/Dockerfile (`make images`):
- `cpu`: prepare_data, evaluate, promote and the job-launching steps (tensorflow-cpu);
- `gpu`: train, in the step's own pod or as the workers of a TrainJob or TFJob (TensorFlow's CUDA build; it runs on
  CPU nodes too).
Why two and not one per stage: the CPU stages need the same packages (the launching step only TensorFlow less), so
one image is one build, one pull per node and one cache key; the CUDA libraries (about 3 GB) stay out of the steps
that never train.

The tag is derived from what goes into the images (the Dockerfile, the requirement and constraint files and every
file under components/), so new code gets a new image reference, and KFP's cache, which keys on the image string,
never reuses the results of older code. CIFAR10_PIPELINE_REGISTRY and CIFAR10_PIPELINE_TAG override both. The images
hold their build inputs, so code inside an image derives the tag it was built with.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

DEFAULT_REGISTRY = "ghcr.io/cifar10-pipeline"
VERSION = "0.1.0"
IMAGE_OF_STAGE = {"prepare_data": "cpu", "evaluate": "cpu", "launcher": "cpu", "train": "gpu"}
KINDS = ("cpu", "gpu")
REPOSITORY = Path(__file__).resolve().parents[1]
# Each stage's components compiled to YAML for other pipelines (`make compile`; pipeline.PUBLISHED_COMPONENTS): derived
# from the code and naming the image tag, so neither a build input nor part of the tag.
PUBLISHED_COMPONENT_FILES = (
    "prepare_data/component.yaml",
    "prepare_data/source_fingerprint.yaml",
    "evaluate/check_data.yaml",
    "train/component.yaml",
    "train/launch_training_job.yaml",
    "evaluate/component.yaml",
    "evaluate/promote.yaml",
    "evaluate/warm_start.yaml",
    "predict/component.yaml",
    "sweep/component.yaml",
)
BUILD_FILES = (
    "images/Dockerfile",
    "requirements.txt",
    "requirements-gpu.txt",
    "constraints.txt",
    "constraints-gpu.txt",
)


def build_inputs(repository: Path = REPOSITORY) -> list[Path]:
    """Every file the images are built from (what .dockerignore lets into the build context), sorted."""
    files = [repository / name for name in BUILD_FILES]
    files += [
        path
        for path in (repository / "components").rglob("*")
        if path.is_file() and not _left_out(path.relative_to(repository))
    ]
    return sorted(files)


def _left_out(relative: Path) -> bool:
    """Byte-code and hidden files or directories (tool caches such as .ruff_cache, editor files): .dockerignore
    keeps them out of the build context, so they are no part of an image or its tag."""
    if relative.as_posix() in {f"components/{name}" for name in PUBLISHED_COMPONENT_FILES}:
        return True
    return relative.suffix == ".pyc" or any(part == "__pycache__" or part.startswith(".") for part in relative.parts)


@functools.cache
def content_tag(repository: Path = REPOSITORY) -> str:
    """VERSION and the first 12 hex digits of a SHA-256 over the build inputs' relative paths and contents."""
    digest = hashlib.sha256()
    for path in build_inputs(repository):
        digest.update(path.relative_to(repository).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())  # reader: the repository's own build inputs
    return f"{VERSION}-{digest.hexdigest()[:12]}"


def is_content_tag(tag: str) -> bool:
    """A tag of content_tag's form (this release's version and 12 hex digits), not one TAG gave."""
    import re

    return re.fullmatch(rf"{re.escape(VERSION)}-[0-9a-f]{{12}}", tag) is not None


def image_tag() -> str:
    given = os.environ.get("CIFAR10_PIPELINE_TAG", "")
    if given:
        return given
    if not (REPOSITORY / "images" / "Dockerfile").is_file():
        raise RuntimeError(
            "no image tag: this is not a source checkout (images/Dockerfile is missing) and CIFAR10_PIPELINE_TAG is "
            "not set"
        )
    return content_tag()


def image_of_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown image {kind!r}; images are {KINDS}")
    registry = os.environ.get("CIFAR10_PIPELINE_REGISTRY", "") or DEFAULT_REGISTRY
    return checked_image(registry.rstrip("/"), kind, image_tag())


def checked_image(registry: str, kind: str, tag: str) -> str:
    """The image `registry`/`kind`:`tag` when the kubelet can pull it; else a ValueError naming TAG or REGISTRY
    (make's variables; the environment's CIFAR10_PIPELINE_TAG and _REGISTRY), before any pipeline names it."""
    import re

    from components.train.launch_config import check_image_reference

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise ValueError(
            f"TAG: {tag!r} is not an image tag (up to 128 letters, digits, '_', '.' and '-', not starting with '.' "
            "or '-')"
        )
    return check_image_reference(f"{registry}/{kind}:{tag}", "REGISTRY")


def image(stage: str) -> str:
    """The image a stage's steps run in."""
    if stage not in IMAGE_OF_STAGE:
        raise ValueError(f"unknown stage {stage!r}; stages are {tuple(IMAGE_OF_STAGE)}")
    return image_of_kind(IMAGE_OF_STAGE[stage])


def images_named_in(text: str) -> tuple[str, str] | None:
    """(registry, tag) of the project's images a compiled pipeline (or component YAML) names, or None when it names
    none (an image of another project's, say)."""
    import re

    found = set(re.findall(r"image: ['\"]?(\S+)/(?:cpu|gpu):([\w][\w.-]*)['\"]?\s*$", text, re.MULTILINE))
    return sorted(found)[0] if len(found) == 1 else None
