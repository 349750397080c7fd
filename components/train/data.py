"""Training input: verified TFRecords -> per-worker, shuffled, augmented batches.

Each input pipeline (one per worker) reads its own part of the data: whole shards when the shards divide
evenly among the pipelines, otherwise every k-th record. Augmentations, drawn independently per image but computed
on whole batches (one gather), so that they cost a few vectorized ops per batch:
- `crop_flip`, the estimator example's distortion: pad to 40x40 with zeros, take a random 32x32 crop, then a random
  horizontal flip;
- `airbench`: a random translation by up to `translate` pixels (reflect padding) and alternating flips: each image
  is flipped in every other epoch, starting from a random choice per image, so that over two epochs it is seen
  both ways (airbench94's "alternating flip", which beats random flipping); optionally a colour jitter (the 2025
  CIFAR-10 speedrun's): each image's brightness shifted by up to `brightness` channel standard deviations, then
  its contrast about the channel means scaled by 1 +- up to `contrast`.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from components.common import records
from components.common.dataset import VerifiedDataset

logger = logging.getLogger(__name__)

PAD = 4
AUGMENTATIONS = ("crop_flip", "airbench")


def augment_batch(
    images: tf.Tensor, seed: tf.Tensor, pad: int = PAD, mode: str = "CONSTANT", flip: tf.Tensor | None = None
) -> tf.Tensor:
    """Random pad-and-crop (a translation by up to `pad` pixels) and horizontal flip of each image in a uint8 batch
    [B, H, W, C]; `flip` ([B] booleans) decides the flips instead of chance.

    The crop is one gather: pixel (i, j) of image b comes from (row_b + i, column_b + j) of its padded copy.
    """
    shape = tf.shape(images)
    batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
    padded_width = width + 2 * pad
    padded = _padded(images, pad, mode)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    offsets = tf.random.stateless_uniform([batch, 2], seeds[0], minval=0, maxval=2 * pad + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(height)[None, :]
    columns = offsets[:, 1:] + tf.range(width)[None, :]
    if flip is None:
        flip = tf.random.stateless_uniform([batch], seeds[1]) < 0.5
    columns = tf.where(flip[:, None], tf.reverse(columns, axis=[1]), columns)
    positions = tf.reshape(rows[:, :, None] * padded_width + columns[:, None, :], [batch, -1])
    pixels = tf.reshape(padded, [batch, -1, channels])
    return tf.reshape(tf.gather(pixels, positions, batch_dims=1), [batch, height, width, channels])


def _padded(images: tf.Tensor, pad: int, mode: str) -> tf.Tensor:
    """`images` padded by `pad` pixels on each side, as tf.pad with `mode`. REFLECT (the edge not repeated) is built
    from reversed slices and two concatenations, where tf.pad's own reflection of uint8 images takes 15 times as
    long (2 against 33 ms for a batch of 1,536 on one core, taken from the cores the training step runs on)."""
    height, width = images.shape[1], images.shape[2]
    if mode != "REFLECT" or pad == 0 or height is None or width is None or pad >= min(height, width):
        return tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]], mode=mode)
    rows = tf.concat([tf.reverse(images[:, 1 : pad + 1], [1]), images, tf.reverse(images[:, -pad - 1 : -1], [1])], 1)
    return tf.concat([tf.reverse(rows[:, :, 1 : pad + 1], [2]), rows, tf.reverse(rows[:, :, -pad - 1 : -1], [2])], 2)


def jitter_batch(
    images: tf.Tensor, seed: tf.Tensor, brightness: float, contrast: float, means: tf.Tensor, deviations: tf.Tensor
) -> tf.Tensor:
    """Each uint8 image [B, H, W, C] with its brightness shifted by up to `brightness` x `deviations` (per channel)
    and then its contrast about `means` scaled by a factor in 1 +- `contrast`, both drawn uniformly per image;
    rounded and clipped back to uint8. On images normalised by `means` and `deviations` this is (x + shift) x
    factor, the 2025 CIFAR-10 speedrun's jitter."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    batch = tf.shape(images)[0]
    shift = tf.random.stateless_uniform([batch, 1, 1, 1], seeds[0], -brightness, brightness)
    factor = 1.0 + tf.random.stateless_uniform([batch, 1, 1, 1], seeds[1], -contrast, contrast)
    pixels = tf.cast(images, tf.float32)
    jittered = means + factor * (pixels - means + shift * deviations)
    return tf.cast(tf.clip_by_value(tf.round(jittered), 0.0, 255.0), tf.uint8)


def alternating_flip(indexes: tf.Tensor, epochs: tf.Tensor, seed: int) -> tf.Tensor:
    """Whether each image (by its index in this pipeline's share) is flipped in its epoch: a fixed random choice
    per image, inverted every other epoch."""
    first = tf.random.stateless_uniform([], [seed, 0], maxval=2**31 - 1, dtype=tf.int64)
    mixed = (indexes * 2654435761 + first) % 2**32  # Knuth's multiplicative hash: a fixed, well-spread bit per index
    return tf.not_equal((mixed // 2**16) % 2, epochs % 2)


def _parse(serialized, image_shape):
    return records.parse_batch(serialized, image_shape)


def _shard(files: list[str], dataset_factory, context: tf.distribute.InputContext):
    pipelines, index = context.num_input_pipelines, context.input_pipeline_id
    if pipelines > 1 and len(files) % pipelines == 0:
        return dataset_factory(files[index::pipelines]), "shards"
    dataset = dataset_factory(files)
    return (dataset.shard(pipelines, index) if pipelines > 1 else dataset), "records"


def train_dataset(
    verified: VerifiedDataset,
    context: tf.distribute.InputContext,
    global_batch_size: int,
    seed: int,
    in_memory: bool = False,
    shuffle_buffer: int = 10000,
    augment: bool = True,
    augmentation: str = "crop_flip",
    translate: int = 2,
    start_step: int = 0,
    brightness: float = 0.0,
    contrast: float = 0.0,
) -> tf.data.Dataset:
    """Endless (uint8 images augmented, int64 labels) batches of this pipeline's share of the global batch, from
    step `start_step` on (a resumed run's). The `airbench` stream is a function of `seed` and the step alone: a
    resumed run gets exactly the batches an uninterrupted one would, and the flips keep alternating. The other
    streams are drawn afresh from `seed + start_step` (a resumed run does not replay the batches it trained on)."""
    if augment and augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation: {augmentation!r} is not one of {AUGMENTATIONS}")
    if augment and augmentation == "airbench":
        return _with_options(
            _alternating_dataset(
                verified,
                context,
                global_batch_size,
                seed,
                shuffle_buffer,
                translate,
                start_step,
                (brightness, contrast),
            )
        )
    if brightness or contrast:
        raise ValueError(f"brightness/contrast: {brightness}/{contrast} need augmentation airbench")
    seed += start_step
    batch_size = context.get_per_replica_batch_size(global_batch_size)
    files = verified.files["train"]
    compression = "" if verified.manifest.compression == records.COMPRESSION_NONE else verified.manifest.compression
    shape = verified.manifest.image_shape

    def read(selected):
        return tf.data.TFRecordDataset(selected, compression_type=compression, num_parallel_reads=min(4, len(selected)))

    if in_memory:
        serialized = tf.concat([batch for batch in _shard(files, read, context)[0].batch(4096)], axis=0)
        images, labels = _parse(serialized, shape)
        logger.info("holding %d training images in memory", int(tf.shape(images)[0]))
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        if shuffle_buffer > 1:
            dataset = dataset.shuffle(int(tf.shape(images)[0]), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        dataset = dataset.batch(batch_size, drop_remainder=True)
    else:
        dataset, how = _shard(files, read, context)
        logger.info("input pipeline %d of %d reads its %s", context.input_pipeline_id, context.num_input_pipelines, how)
        if shuffle_buffer > 1:
            dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        dataset = dataset.batch(batch_size, drop_remainder=True)
        dataset = dataset.map(lambda serialized: _parse(serialized, shape), num_parallel_calls=tf.data.AUTOTUNE)
    if augment:
        augment_seeds = tf.data.Dataset.random(seed=seed + context.input_pipeline_id).batch(2)
        dataset = tf.data.Dataset.zip(dataset, augment_seeds).map(
            lambda batch, pair: (augment_batch(batch[0], pair), batch[1]), num_parallel_calls=tf.data.AUTOTUNE
        )
    return _with_options(dataset)


def _alternating_dataset(verified, context, global_batch_size, seed, shuffle_buffer, translate, start_step, jitter):
    """The training images of this pipeline, in memory, epoch by epoch (each shuffled with its own seed), with the
    airbench augmentation: the epoch and each image's index decide its flip. Batches run on across epoch
    boundaries; step `start_step` starts at image `start_step x batch` of that endless sequence."""
    batch_size = context.get_per_replica_batch_size(global_batch_size)
    compression = "" if verified.manifest.compression == records.COMPRESSION_NONE else verified.manifest.compression

    def read(selected):
        return tf.data.TFRecordDataset(selected, compression_type=compression)

    serialized = tf.concat([batch for batch in _shard(verified.files["train"], read, context)[0].batch(4096)], 0)
    images, labels = _parse(serialized, verified.manifest.image_shape)
    count = int(tf.shape(images)[0])
    indexed = tf.data.Dataset.range(count)

    def epoch_of(epoch):
        if shuffle_buffer <= 1:
            return indexed.map(lambda index: (epoch, index))
        # A stateless permutation of (seed, epoch): tf.data's shuffle would read a tensor seed of 0 as a Python bool.
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), seed=key)
        return tf.data.Dataset.from_tensor_slices(order).map(lambda index: (epoch, index))

    first_epoch, offset = divmod(start_step * batch_size, count)
    dataset = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch_of).skip(offset)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    augment_seeds = tf.data.Dataset.random(seed=seed + context.input_pipeline_id).batch(2).skip(start_step)
    brightness, contrast = jitter
    if brightness or contrast:  # the channels' means and deviations, from up to 10,000 images (enough to 0.1%)
        sample = tf.reshape(tf.cast(images[:10_000], tf.float32), [-1, verified.manifest.image_shape[-1]])
        means, deviations = tf.reduce_mean(sample, axis=0), tf.math.reduce_std(sample, axis=0)

    def augment(batch, pair):
        epochs, indexes = batch
        flip = alternating_flip(indexes, epochs, seed)
        chosen = augment_batch(tf.gather(images, indexes), pair, pad=translate, mode="REFLECT", flip=flip)
        if brightness or contrast:
            jitter_seed = tf.random.experimental.stateless_fold_in(pair, 1)
            chosen = jitter_batch(chosen, jitter_seed, brightness, contrast, means, deviations)
        return chosen, tf.gather(labels, indexes)

    logger.info(
        "holding %d training images in memory (alternating flips, translation by %d%s)",
        count,
        translate,
        f", brightness +-{brightness} standard deviations, contrast x(1 +- {contrast})"
        if brightness or contrast
        else "",
    )
    return tf.data.Dataset.zip(dataset, augment_seeds).map(augment, num_parallel_calls=tf.data.AUTOTUNE)


def _with_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF  # sharded above
    options.deterministic = True
    # The pipeline's work is small next to a training step; one thread per op keeps it from competing with
    # the step for the cores (prefetching keeps it ahead).
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
