"""The container image of every stage, set in this one place.

`make images` builds them and `make push REGISTRY=...` pushes them under these names; compiling the
pipeline with CIFAR10_PIPELINE_REGISTRY / CIFAR10_PIPELINE_TAG set points the components at another
registry or tag.
"""

from __future__ import annotations

import os

DEFAULT_REGISTRY = "ghcr.io/cifar10-pipeline"
DEFAULT_TAG = "0.1.0"
STAGES = ("prepare_data", "train", "evaluate", "launcher")  # launcher: the small TFJob-launching image


def image(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
    registry = os.environ.get("CIFAR10_PIPELINE_REGISTRY", DEFAULT_REGISTRY).rstrip("/")
    tag = os.environ.get("CIFAR10_PIPELINE_TAG", DEFAULT_TAG)
    return f"{registry}/{stage.replace('_', '-')}:{tag}"
