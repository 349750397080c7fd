"""A small, deterministic, learnable CIFAR-shaped dataset for offline demos and tests.

Each class has its own colour and stripe pattern; every image is its class's pattern, shifted by up to
four pixels, over a smooth grey background of its own (a few random low-frequency waves: without it, every image
of a class would be a near-duplicate of the others, which statistics.json would rightly report), under Gaussian
noise. A small ResNet learns it in a few hundred steps. Outputs made from
it are named `synthetic` in every manifest and artifact, so they are never mistaken for CIFAR-10.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from components.prepare_data.pixel_file import PixelFile
from components.prepare_data.sources import CIFAR_SHAPE, RawDataset, RawSplit

NOISE_STANDARD_DEVIATION = 48.0
BACKGROUND_AMPLITUDE = 30.0  # of each of BACKGROUND_WAVES waves
BACKGROUND_WAVES = 4
GENERATOR = "stripes-v2"


def class_prototypes(num_classes: int) -> np.ndarray:
    """float32 [num_classes, 32, 32, 3]: a colour times a stripe pattern per class, in [0, 255]."""
    rows, columns = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    prototypes = np.zeros((num_classes, *CIFAR_SHAPE), np.float32)
    for label in range(num_classes):
        hue = 2 * np.pi * label / num_classes
        colour = 127.5 + 110 * np.cos(hue + np.array([0.0, 2.094, 4.189]))
        angle = np.pi * (label % 4) / 4
        frequency = 2 * np.pi * (2 + label // 4) / 32
        stripes = 0.5 + 0.5 * np.sin(frequency * (np.cos(angle) * rows + np.sin(angle) * columns))
        prototypes[label] = colour[None, None, :] * (0.35 + 0.65 * stripes[..., None])
    return prototypes


def background_waves(count: int, rng: np.random.Generator) -> np.ndarray:
    """float64 [BACKGROUND_WAVES, 3, count]: each image's waves (cycles down, cycles across, phase), drawn wave by
    wave for all the images at once (so the draws, and the images, are those of any earlier version)."""
    waves = []
    for _ in range(BACKGROUND_WAVES):
        down, across = rng.uniform(0, 3, size=(2, count))
        waves.append((down, across, rng.uniform(0, 2 * np.pi, size=count)))
    return np.asarray(waves)


def smooth_backgrounds(waves: np.ndarray) -> np.ndarray:
    """float32 [n, 32, 32]: per image the sum of its BACKGROUND_WAVES waves (`background_waves`' [waves, 3, n])."""
    rows, columns = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    backgrounds = np.zeros((waves.shape[-1], 32, 32), np.float32)
    for down, across, phase in waves:
        down, across, phase = (value[:, None, None] for value in (down, across, phase))
        backgrounds += np.cos(2 * np.pi * (down * rows + across * columns) / 32 + phase)
    return BACKGROUND_AMPLITUDE * backgrounds


GENERATED_IMAGES = 4096  # made at a time, then appended to the split's scratch file: memory holds a chunk


def _generate_split(prototypes: np.ndarray, per_class: int, rng: np.random.Generator, name: str) -> RawSplit:
    num_classes = len(prototypes)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
    shifts = rng.integers(-4, 5, size=(len(labels), 2))
    waves = background_waves(len(labels), rng)
    pixels = PixelFile(CIFAR_SHAPE)
    for start in range(0, len(labels), GENERATED_IMAGES):
        chunk = slice(start, start + GENERATED_IMAGES)
        backgrounds = smooth_backgrounds(waves[..., chunk])
        images = np.empty((len(backgrounds), *CIFAR_SHAPE), np.uint8)
        for offset, (label, (down, right)) in enumerate(zip(labels[chunk], shifts[chunk], strict=True)):
            pattern = np.roll(prototypes[label], (down, right), axis=(0, 1)) + backgrounds[offset][..., None]
            noisy = pattern + rng.normal(0.0, NOISE_STANDARD_DEVIATION, CIFAR_SHAPE)
            images[offset] = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        pixels.append(images)
    return RawSplit.from_array(pixels, labels, [f"synthetic/{name}/{index:06d}" for index in range(len(labels))])


def generate(num_classes: int, train_per_class: int, eval_per_class: int, seed: int) -> RawDataset:
    rng = np.random.default_rng(seed)
    prototypes = class_prototypes(num_classes)
    return RawDataset(
        dataset="synthetic",
        label_names=[f"synthetic_class_{label}" for label in range(num_classes)],
        train=_generate_split(prototypes, train_per_class, rng, "train"),
        eval=_generate_split(prototypes, eval_per_class, rng, "eval"),
        holdout=None,
        source={
            "uri": "synthetic",
            "format": "synthetic",
            "specification": specification(num_classes, train_per_class, eval_per_class, seed),
        },
    )


def specification(num_classes: int, train_per_class: int, eval_per_class: int, seed: int) -> dict:
    """Everything the generated data depends on; its digest plays the part of a source archive's SHA-256."""
    return {
        "generator": GENERATOR,
        "num_classes": num_classes,
        "train_per_class": train_per_class,
        "eval_per_class": eval_per_class,
        "seed": seed,
    }


def specification_sha256(described: dict) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
