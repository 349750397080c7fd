"""The data check tells changes apart and names them: on small generated images (four classes of coloured shapes on
smooth backgrounds with noise, 150 of each), each kind of change a user would call a problem is found as its own
kind, in its split, with the setting that controls it; a label finding only when the look held; an unchanged sample
drawn the same way is no finding; and statistics written before the look was recorded are still read, what they
lack said as not compared. On ten classes (so that one is a tenth of the images), one class's images changed alone
are that class's look, not its labels; blank frames mixed in are not labels shuffled."""

from __future__ import annotations

import numpy as np
import pytest

from components.common import data_statistics
from components.common.data_statistics import ERROR, NOTE, DataCheckConfig
from components.prepare_data import statistics, synthetic

CLASSES = ["apple", "boat", "cloud", "dune"]
PER_CLASS = 150


def drawn(seed: int, per_class: int = PER_CLASS, classes: int = len(CLASSES)) -> tuple[np.ndarray, np.ndarray]:
    """Images of each class: its prototype (a colour, stripes) shifted at random, on a smooth background, with
    noise; uint8 [n, 32, 32, 3] and their labels."""
    rng = np.random.default_rng(seed)
    prototypes = synthetic.class_prototypes(classes) * 0.6
    images, labels = [], []
    for label in range(classes):
        backgrounds = synthetic.smooth_backgrounds(synthetic.background_waves(per_class, rng))
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


def test_a_share_of_blank_frames_is_not_read_as_labels_shuffled(reference):
    """4% of the images replaced by white frames: the pixel spread widens while the classes stay as far apart; that
    was read as 'labels shuffled within about 26%'."""
    images, labels = drawn(1)
    images[np.random.default_rng(4).choice(len(images), len(images) // 25, replace=False)] = 255
    found = errors(described(images, labels), reference)
    assert not [finding.line() for finding in found if finding.kind in ("label_noise", "labels_moved")]


def test_labels_off_by_one_name_each_class_and_a_readable_ratio(reference):
    """Every label moved to the next class: each class's images are the reference's previous class's, at a distance
    within chance of nothing; the ratio is said in words, not as a number in the hundreds of billions."""
    images, labels = drawn(1)
    found = errors(described(images, (labels + 1) % len(CLASSES)), reference)
    moved = {finding.class_name: finding.message for finding in found if finding.kind == "labels_moved"}
    assert set(moved) == set(CLASSES), [finding.line() for finding in found]
    assert "look more like the reference's 'apple' than like its 'boat'" in moved["boat"]
    assert all("against 0.0, ratio over 1000 >= 1" in message for message in moved.values()), moved


TEN_CLASSES = [f"class-{index}" for index in range(10)]
TEN_PER_CLASS = 300  # a class's mean image at this count tells a quarter turn of its stripes from chance


@pytest.fixture(scope="module")
def ten_class_reference() -> dict:
    return described(*drawn(0, per_class=TEN_PER_CLASS, classes=10), names=TEN_CLASSES)


def of_class(alter, label: int = 1):
    """`alter` made to the images of one class alone (a tenth of the images)."""

    def changed(images: np.ndarray, labels: np.ndarray):
        images = images.copy()
        images[labels == label] = alter(images[labels == label])
        return images, labels

    return changed


ONE_CLASS = {  # the change, the class it is made to (class 2's stripes run across the frame), words, setting
    "grey": (of_class(greyed), 1, "grey (no colour)", "saturation_change"),
    "blurred": (of_class(blurred), 1, "less fine detail", "detail_change"),
    "darker": (of_class(lambda images: clipped(images.astype(int) - 40)), 1, "darker", "channel_mean_shift"),
    "rotated": (of_class(lambda images: np.rot90(images, 1, axes=(1, 2)).copy(), 2), 2, "rotated", "layout_change"),
}


def one_class_changed(change: str) -> dict:
    alter, *_rest = ONE_CLASS[change]
    return described(*alter(*drawn(1, per_class=TEN_PER_CLASS, classes=10)), names=TEN_CLASSES)


@pytest.mark.parametrize("change", ONE_CLASS, ids=list(ONE_CLASS))
def test_one_class_changed_alone_is_named_with_its_class(ten_class_reference, change):
    """The images of one class alone changed, too few to move the split's look: a model would learn the change as
    the class. It is one 'class_look' finding naming the class and how it changed, and no label is blamed."""
    _alter, label, words, setting = ONE_CLASS[change]
    found = errors(one_class_changed(change), ten_class_reference)
    assert [(finding.kind, finding.class_name) for finding in found] == [("class_look", f"class-{label}")], [
        finding.line() for finding in found
    ]
    assert words in found[0].message and found[0].setting == setting, found[0].line()
    assert f"'class-{label}' images alone look otherwise" in found[0].message


def test_an_unchanged_sample_of_ten_classes_is_no_finding(ten_class_reference):
    found = data_statistics.check(described(*drawn(1, per_class=TEN_PER_CLASS, classes=10), names=TEN_CLASSES),
                                  ten_class_reference, DataCheckConfig())  # fmt: skip
    assert found == [], [finding.line() for finding in found]


def test_two_classes_swapped_are_labels_not_a_class_look(ten_class_reference):
    images, labels = drawn(1, per_class=TEN_PER_CLASS, classes=10)
    swapped = np.where(labels == 0, 1, np.where(labels == 1, 0, labels))
    kinds = {finding.kind for finding in errors(described(images, swapped, names=TEN_CLASSES), ten_class_reference)}
    assert kinds == {"labels_moved"}


def test_a_reference_without_the_classes_looks_still_compares_their_layout(ten_class_reference):
    """Statistics of the release before the classes' looks were recorded: a class turned is still found (by its mean
    image, which every release recorded); a class turned grey is not (its colour was not recorded); moved labels are
    said with both causes, as the classes' looks cannot tell them from changed images; an unchanged sample is no
    finding."""
    older = {
        **ten_class_reference,
        "splits": {
            "train": {
                key: value
                for key, value in ten_class_reference["splits"]["train"].items()
                if key not in ("class_per_image", "class_look_images")
            }
        },
    }
    assert data_statistics.check(described(*drawn(1, per_class=TEN_PER_CLASS, classes=10), names=TEN_CLASSES), older,
                                 DataCheckConfig()) == []  # fmt: skip
    assert [finding.kind for finding in errors(one_class_changed("rotated"), older)] == ["class_look"]
    assert errors(one_class_changed("grey"), older) == []  # its colour was not recorded
    images, labels = drawn(1, per_class=TEN_PER_CLASS, classes=10)
    swapped = np.where(labels == 0, 1, np.where(labels == 1, 0, labels))
    moved = errors(described(images, swapped, names=TEN_CLASSES), older)
    assert {finding.kind for finding in moved} == {"labels_moved"}
    assert all("labels moved, or this class's images changed" in finding.message for finding in moved)
