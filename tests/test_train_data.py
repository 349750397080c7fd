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
def test_a_resumed_airbench_stream_is_the_uninterrupted_one_from_that_step_on(synthetic_data, seed):
    """A run resumed at step 4 (mid-epoch: 160 images, batch 48) trains on exactly the batches the uninterrupted run
    would have: same order, same translations, and the flips keep alternating."""
    verified = open_dataset(synthetic_data, splits=("train",))
    keras.utils.set_random_seed(seed)  # as the trainer does (a global seed of 0 broke tf.data's seeded shuffle)

    def batches(start_step: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        stream = data.train_dataset(
            verified, tf.distribute.InputContext(), 48, seed=seed, augmentation="airbench", start_step=start_step
        )
        return [(images.numpy(), labels.numpy()) for images, labels in stream.take(count)]

    uninterrupted, resumed = batches(0, 9), batches(4, 5)
    for step, ((images, labels), (resumed_images, resumed_labels)) in enumerate(
        zip(uninterrupted[4:], resumed, strict=True), start=4
    ):
        np.testing.assert_array_equal(resumed_labels, labels, err_msg=f"step {step}: other images")
        np.testing.assert_array_equal(resumed_images, images, err_msg=f"step {step}: other augmentation")
    assert not np.array_equal(uninterrupted[4][0], uninterrupted[0][0])  # the stream does move on


def test_airbench_augmentation_translates_with_reflected_borders():
    images = np.random.default_rng(1).integers(0, 256, size=(32, 32, 32, 3), dtype=np.uint8)
    flip = tf.zeros([32], tf.bool)
    shifted = data.augment_batch(tf.constant(images), tf.constant([5, 6], tf.int64), pad=2, mode="REFLECT", flip=flip)
    padded = np.pad(images, [(0, 0), (2, 2), (2, 2), (0, 0)], mode="reflect")
    for original, result in zip(padded, shifted.numpy(), strict=True):
        assert any(
            np.array_equal(result, original[row : row + 32, column : column + 32])
            for row in range(5)
            for column in range(5)
        )


def _as_array(verified):
    images, _ = next(iter(verified.tf_dataset("train", batch_size=100000)))
    return images.numpy()
