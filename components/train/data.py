"""Training input: verified TFRecords -> per-worker, shuffled, augmented batches.

Each input pipeline (one per worker) reads its own part of the data: whole shards when the shards divide
evenly among the pipelines, otherwise every k-th record. Augmentation is the estimator example's distortion, pad to
40x40 and take a random 32x32 crop, then a random horizontal flip, drawn independently per image but
computed on whole batches (one gather), so it costs a few vectorized ops per batch.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from components.common import records
from components.common.dataset import VerifiedDataset

logger = logging.getLogger(__name__)

PAD = 4


def augment_batch(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Random pad-4-and-crop and horizontal flip of each image in a uint8 batch [B, H, W, C].

    The crop is one gather: pixel (i, j) of image b comes from (row_b + i, column_b + j) of its padded copy.
    """
    shape = tf.shape(images)
    batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
    padded_width = width + 2 * PAD
    padded = tf.pad(images, [[0, 0], [PAD, PAD], [PAD, PAD], [0, 0]])
    seeds = tf.random.experimental.stateless_split(seed, 3)
    offsets = tf.random.stateless_uniform([batch, 2], seeds[0], minval=0, maxval=2 * PAD + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(height)[None, :]
    columns = offsets[:, 1:] + tf.range(width)[None, :]
    flip = tf.random.stateless_uniform([batch], seeds[1]) < 0.5
    columns = tf.where(flip[:, None], tf.reverse(columns, axis=[1]), columns)
    positions = tf.reshape(rows[:, :, None] * padded_width + columns[:, None, :], [batch, -1])
    pixels = tf.reshape(padded, [batch, -1, channels])
    return tf.reshape(tf.gather(pixels, positions, batch_dims=1), [batch, height, width, channels])


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
) -> tf.data.Dataset:
    """Endless (uint8 images augmented, int64 labels) batches of this pipeline's share of the global batch."""
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
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF  # sharded above
    options.deterministic = True
    # The pipeline's work is small next to a training step; one thread per op keeps it from competing with
    # the step for the cores (prefetching keeps it ahead).
    options.threading.max_intra_op_parallelism = 1
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
