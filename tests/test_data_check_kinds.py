"""The data check tells changes apart and names them: on small generated images (four classes of coloured shapes on
smooth backgrounds with noise, 150 of each), each kind of change a user would call a problem is found as its own
kind, in its split, with the setting that controls it; a label finding only when the look held; an unchanged sample
drawn the same way is no finding; and statistics written before the look was recorded are still read, what they
lack said as not compared."""

from __future__ import annotations

import numpy as np
import pytest

from components.common import data_statistics
from components.common.data_statistics import ERROR, NOTE, DataCheckConfig
from components.prepare_data import statistics, synthetic

CLASSES = ["apple", "boat", "cloud", "dune"]
PER_CLASS = 150


def drawn(seed: int, per_class: int = PER_CLASS) -> tuple[np.ndarray, np.ndarray]:
    """Images of each class: its prototype (a colour, stripes) shifted at random, on a smooth background, with
    noise; uint8 [n, 32, 32, 3] and their labels."""
    rng = np.random.default_rng(seed)
    prototypes = synthetic.class_prototypes(len(CLASSES)) * 0.6
    images, labels = [], []
    for label in range(len(CLASSES)):
        backgrounds = synthetic.smooth_backgrounds(per_class, rng)
        for index in range(per_class):
            down, right = rng.integers(-3, 4, size=2)
            image = np.roll(prototypes[label], (down, right), axis=(0, 1)) + backgrounds[index][..., None] * 0.8
            images.append(image + rng.normal(0, 8, image.shape))
            labels.append(label)
    return np.clip(np.rint(images), 0, 255).astype(np.uint8), np.array(labels)


def described(images: np.ndarray, labels: np.ndarray, names: list[str] = CLASSES) -> dict:
    """A statistics document of one training split, by prepare_data's own code."""
    split = statistics.SplitStatistics(len(names))
    sizes = np.full((len(images), 2), images.shape[1])
    split.add(images, labels, [str(index) for index in range(len(images))], sizes, None)
    return {"schema_version": 2, "label_names": names, "splits": {"train": split.summary()}, "duplicates": [],
            "leakage": {}}  # fmt: skip


@pytest.fixture(scope="module")
def reference() -> dict:
    return described(*drawn(0))


def errors(document: dict, reference: dict, **thresholds) -> list:
    found = data_statistics.check(document, reference, DataCheckConfig(**thresholds))
    return [finding for finding in found if finding.severity == ERROR]


def clipped(values) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def blurred(images: np.ndarray) -> np.ndarray:
    padded = np.pad(images.astype(float), ((0, 0), (1, 1), (1, 1), (0, 0)), "edge")
    return clipped(sum(padded[:, down : down + 32, right : right + 32] for down in range(3) for right in range(3)) / 9)


def greyed(images: np.ndarray) -> np.ndarray:
    return clipped(np.repeat((images.astype(float) @ statistics.LUMA)[..., None], 3, axis=-1))


def with_contrast(images: np.ndarray, factor: float) -> np.ndarray:
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    return clipped(mean + factor * (images - mean))


def shuffled(labels: np.ndarray, fraction: float, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(labels), round(fraction * len(labels)), replace=False)
    labels = labels.copy()
    labels[chosen] = rng.permutation(labels[chosen])
    return labels


CHANGES = {
    "brighter": (lambda images, labels: (clipped(images.astype(int) + 25), labels), "brightness", "channel_mean_shift",
                 "brighter images"),
    "darker": (lambda images, labels: (clipped(images.astype(int) - 25), labels), "brightness", "channel_mean_shift",
               "darker images"),
    "contrast halved": (lambda images, labels: (with_contrast(images, 0.5), labels), "contrast",
                        "channel_spread_change", "less contrast"),
    "grey": (lambda images, labels: (greyed(images), labels), "saturation", "saturation_change", "grey images"),
    "red and blue swapped": (lambda images, labels: (images[..., ::-1].copy(), labels), "colour_balance",
                             "colour_shift", "red and blue swapped"),
    "tinted": (lambda images, labels: (clipped(images + np.array([18.0, 0.0, -18.0])), labels), "colour_balance",
               "colour_shift", "warmer tint"),
    "blurred": (lambda images, labels: (blurred(images), labels), "detail", "detail_change", "less fine detail"),
    "noisy": (lambda images, labels: (clipped(images + np.random.default_rng(3).normal(0, 12, images.shape)),
                                      labels), "detail", "detail_change", "more fine detail: noise"),
    "upside down": (lambda images, labels: (images[:, ::-1].copy(), labels), "layout", "layout_change",
                    "the images look upside down"),
    "rotated": (lambda images, labels: (np.rot90(images, 1, axes=(1, 2)).copy(), labels), "layout", "layout_change",
                "rotated"),
    "labels shuffled": (lambda images, labels: (images, shuffled(labels, 0.4)), "label_noise", "label_noise",
                        "labels shuffled within about"),
    "class thinned": (lambda images, labels: (images[(labels != 2) | (np.arange(len(labels)) % 3 == 0)],
                                              labels[(labels != 2) | (np.arange(len(labels)) % 3 == 0)]),
                      "class_balance", "class_share_change", "fewer 'cloud' images"),
}  # fmt: skip


def test_an_unchanged_sample_drawn_the_same_way_is_no_finding(reference):
    assert data_statistics.check(described(*drawn(1)), reference, DataCheckConfig()) == []


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_each_kind_of_change_is_found_and_named_as_its_kind(reference, change):
    alter, kind, setting, words = CHANGES[change]
    found = errors(described(*alter(*drawn(1))), reference)
    named = [finding for finding in found if finding.kind == kind]
    assert named, [finding.line() for finding in found]
    finding = named[0]
    assert words in finding.message and finding.split == "train" and finding.setting == setting
    assert finding.message.startswith("train: ") and f"{setting}" in finding.message and "\n" not in finding.line()
    if kind not in ("label_noise", "class_balance"):  # the images changed: no label is blamed
        assert not [f.line() for f in found if f.kind in ("labels_moved", "label_noise")]


def test_a_threshold_set_higher_lets_the_change_pass(reference):
    alter, *_rest = CHANGES["brighter"]
    assert errors(described(*alter(*drawn(1))), reference, channel_mean_shift=5.0, pixel_divergence=1.0) == []


def test_a_small_sample_widens_the_limit_to_what_chance_moves_and_says_so(reference):
    """40 images of each class: a brightness shift chance could make is not a finding; a large one is, its line
    naming the widened limit."""
    images, labels = drawn(2, per_class=10)
    assert errors(described(clipped(images.astype(int) + 3), labels), reference) == []
    (finding,) = [f for f in errors(described(clipped(images.astype(int) + 40), labels), reference)
                  if f.kind == "brightness"]  # fmt: skip
    assert "widened for what chance moves at 40 images" in finding.message


def test_statistics_of_an_earlier_release_are_read_and_what_they_lack_is_not_compared(reference):
    """A reference written before the look was recorded (schema 1): no change is made of what it lacks, and a note
    says what was not compared; what it has is still compared."""
    older = {**reference, "schema_version": 1, "splits": {"train": {key: value for key, value in
             reference["splits"]["train"].items() if key not in ("channel_histogram", "saturation_histogram",
             "detail_histogram", "per_image")}}}  # fmt: skip
    found = data_statistics.check(described(*drawn(1)), older, DataCheckConfig())
    assert [finding.kind for finding in found] == ["not_compared"] and found[0].severity == NOTE
    assert "not compared: colour saturation, fine detail" in found[0].message
    brighter, *_rest = CHANGES["brighter"]
    assert "brightness" in {finding.kind for finding in errors(described(*brighter(*drawn(1))), older)}
