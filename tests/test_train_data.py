"""The training input: augmentation is an exact crop-and-flip per image; workers read disjoint parts."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.common.dataset import open_dataset
from components.train import data


def test_augmentation_is_a_pad_4_crop_and_optional_flip_of_each_image():
    images = np.random.default_rng(0).integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8)
    augmented = data.augment_batch(tf.constant(images), tf.constant([3, 4], tf.int64)).numpy()
    padded = np.pad(images, [(0, 0), (4, 4), (4, 4), (0, 0)])
    crops_seen, flips_seen = set(), 0
    for original, result in zip(padded, augmented, strict=True):
        matches = [
            (row, column, flipped)
            for row in range(9)
            for column in range(9)
            for flipped in (False, True)
            if np.array_equal(
                result,
                (original[row : row + 32, column : column + 32])[:, ::-1]
                if flipped
                else original[row : row + 32, column : column + 32],
            )
        ]
        assert matches, "an augmented image is not a crop (or flipped crop) of its padded original"
        crops_seen.add(matches[0][:2])
        flips_seen += matches[0][2]
    assert len(crops_seen) > 10 and 10 < flips_seen < 54  # offsets and flips vary from image to image


def test_each_worker_reads_its_own_part_of_the_data(synthetic_data):
    verified = open_dataset(synthetic_data, splits=("train",))
    seen = []
    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=2)
        dataset = data.train_dataset(verified, context, 32, seed=1, shuffle_buffer=1, augment=False)
        images, _labels = next(iter(dataset.take(1)))
        assert images.shape == (16, 32, 32, 3)  # half of the global batch
        seen.append({image.tobytes() for image in images.numpy()})
    assert not seen[0] & seen[1]


def test_airbench_augmentation_flips_every_image_in_exactly_one_of_two_epochs(synthetic_data):
    """Alternating flips: over two consecutive epochs each image is seen once as it is and once mirrored (with no
    translation, so that the flip alone shows); a random flip would leave some images unflipped in both."""
    verified = open_dataset(synthetic_data, splits=("train",))
    originals, _ = next(iter(verified.tf_dataset("train", batch_size=100000)))
    originals = {image.tobytes(): index for index, image in enumerate(originals.numpy())}
    mirrored = {image[:, ::-1].tobytes(): index for index, image in enumerate(_as_array(verified))}
    count = len(originals)
    epochs = data.train_dataset(
        verified, tf.distribute.InputContext(), count, seed=3, augmentation="airbench", translate=0
    ).take(2)
    flipped_in = []
    for images, _labels in epochs:
        flipped = set()
        for image in images.numpy():
            key = image.tobytes()
            assert key in originals or key in mirrored, "an augmented image is neither the original nor its mirror"
            if key in mirrored and key not in originals:
                flipped.add(mirrored[key])
        flipped_in.append(flipped)
    assert 0.3 * count < len(flipped_in[0]) < 0.7 * count  # the first epoch's choice is random per image
    assert flipped_in[0].isdisjoint(flipped_in[1]) and len(flipped_in[0] | flipped_in[1]) == count


@pytest.mark.parametrize("seed", [5, 0])  # 0: any seed in the config's range (tf.data's shuffle refused it)
@pytest.mark.parametrize("jitter", [(0.0, 0.0), (0.14, 0.13)])
def test_a_resumed_airbench_stream_is_the_uninterrupted_one_from_that_step_on(synthetic_data, seed, jitter):
    """A run resumed at step 4 (mid-epoch: 160 images, batch 48) trains on exactly the batches the uninterrupted run
    would have: same order, same translations, and the flips keep alternating."""
    verified = open_dataset(synthetic_data, splits=("train",))
    keras.utils.set_random_seed(seed)  # as the trainer does (a global seed of 0 broke tf.data's seeded shuffle)

    def batches(start_step: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        stream = data.train_dataset(
            verified,
            tf.distribute.InputContext(),
            48,
            seed=seed,
            augmentation="airbench",
            start_step=start_step,
            brightness=jitter[0],
            contrast=jitter[1],
        )
        return [(images.numpy(), labels.numpy()) for images, labels in stream.take(count)]

    uninterrupted, resumed = batches(0, 9), batches(4, 5)
    for step, ((images, labels), (resumed_images, resumed_labels)) in enumerate(
        zip(uninterrupted[4:], resumed, strict=True), start=4
    ):
        np.testing.assert_array_equal(resumed_labels, labels, err_msg=f"step {step}: other images")
        np.testing.assert_array_equal(resumed_images, images, err_msg=f"step {step}: other augmentation")
    assert not np.array_equal(uninterrupted[4][0], uninterrupted[0][0])  # the stream does move on


@pytest.mark.parametrize(
    ("height", "width", "pad", "static"),
    [(32, 32, 2, True), (5, 7, 1, True), (5, 7, 4, True), (6, 9, 3, False), (4, 4, 4, True)],
)
def test_airbench_augmentation_translates_with_reflected_borders(height, width, pad, static):
    """Each image is a window of its reflected padding (numpy's "reflect": the edge not repeated), whether the
    image size is known when traced or not; a pad as large as the image is refused, as tf.pad refuses it."""
    images = np.random.default_rng(1).integers(0, 256, size=(32, height, width, 3), dtype=np.uint8)
    flip = tf.zeros([32], tf.bool)
    signature = [tf.TensorSpec([None, *(images.shape[1:] if static else (None, None, 3))], tf.uint8)]
    augment = tf.function(
        lambda batch: data.augment_batch(batch, tf.constant([5, 6], tf.int64), pad=pad, mode="REFLECT", flip=flip),
        input_signature=signature,
    )
    if pad >= min(height, width):
        with pytest.raises(tf.errors.InvalidArgumentError):
            augment(tf.constant(images))
        return
    shifted = augment(tf.constant(images))
    padded = np.pad(images, [(0, 0), (pad, pad), (pad, pad), (0, 0)], mode="reflect")
    for original, result in zip(padded, shifted.numpy(), strict=True):
        assert any(
            np.array_equal(result, original[row : row + height, column : column + width])
            for row in range(2 * pad + 1)
            for column in range(2 * pad + 1)
        )


def test_colour_jitter_shifts_brightness_then_scales_contrast_about_the_channel_means_per_image():
    """On normalised images the jitter is (x + shift) x factor with one shift in +-brightness and one factor in
    1 +- contrast per image, the same for every pixel and channel of it; uint8 in, uint8 out."""
    images = np.random.default_rng(2).integers(60, 196, size=(400, 8, 8, 3), dtype=np.uint8)
    means, deviations = np.array([120.0, 125.0, 115.0]), np.array([60.0, 55.0, 65.0])
    jittered = data.jitter_batch(tf.constant(images), tf.constant([7, 8], tf.int64), 0.1, 0.2, means, deviations)
    assert jittered.dtype == tf.uint8
    before = (images - means) / deviations
    after = (jittered.numpy() - means) / deviations
    shifts, factors = [], []
    for original, result in zip(before, after, strict=True):
        # result = factor x (original + shift): a line through each image's pixels, up to the rounding to uint8
        factor, intercept = np.polyfit(original.ravel(), result.ravel(), 1)
        factors.append(factor)
        shifts.append(intercept / factor)
        assert np.abs(result - factor * (original + intercept / factor)).max() < 1.0 / deviations.min()  # a pixel level
    factors, shifts = np.array(factors), np.array(shifts)
    assert 0.8 - 1e-2 < factors.min() < 0.85 and 1.15 < factors.max() < 0.2 + 1 + 1e-2
    assert -0.1 - 1e-2 < shifts.min() < -0.08 and 0.08 < shifts.max() < 0.1 + 1e-2
    assert abs(np.corrcoef(factors, shifts)[0, 1]) < 0.2  # drawn independently


def test_colour_jitter_clips_at_the_ends_of_the_pixel_range():
    images = np.full((64, 4, 4, 3), 250, np.uint8)
    images[:, :2] = 3
    jittered = data.jitter_batch(tf.constant(images), tf.constant([1, 2], tf.int64), 1.0, 0.5, 128.0, 64.0).numpy()
    assert jittered.max() == 255 and jittered.min() == 0


def test_colour_jitter_outside_the_airbench_augmentation_is_refused():
    from components.common.config import config_from_mapping
    from components.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"brightness/contrast: 0.1/0.0 need augmentation airbench"):
        config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "brightness": 0.1}, "test")
    with pytest.raises(ValueError, match=r"contrast"):
        config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "contrast": 1.0}, "test")


def _as_array(verified):
    images, _ = next(iter(verified.tf_dataset("train", batch_size=100000)))
    return images.numpy()
