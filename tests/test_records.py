"""The record schema: bytes identical to TensorFlow's own writer, framing checked, parse round trip."""

from __future__ import annotations

import numpy as np
import pytest

from components.common import records


def tensorflow_written_file(tmp_path, images, labels, ids) -> bytes:
    """The same examples written by tf.io.TFRecordWriter from tf.train.Example (deterministic serialization)."""
    import tensorflow as tf

    def int64(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    path = str(tmp_path / "reference.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for image, label, example_id in zip(images, labels, ids, strict=True):
            features = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                "label": int64(int(label)),
                "height": int64(image.shape[0]),
                "width": int64(image.shape[1]),
                "channels": int64(image.shape[2]),
                "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[example_id.encode()])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=features))
            writer.write(example.SerializeToString(deterministic=True))
    with open(path, "rb") as handle:
        return handle.read()


@pytest.mark.parametrize(
    ("ids", "labels"),
    [
        ([f"data_batch_1/{index:05d}" for index in range(50)], np.arange(50) % 10),  # one layout: vectorized path
        ([f"train/cat/{index}.png" for index in range(50)], np.arange(50) % 10),  # ids of several lengths
        ([f"b/{index:02d}" for index in range(50)], np.arange(50) * 7),  # labels >= 128: multi-byte varints
    ],
    ids=["fixed-layout", "varying-ids", "large-labels"],
)
def test_shards_are_byte_identical_to_tensorflows_writer(tmp_path, ids, labels):
    images = np.random.default_rng(3).integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)
    assert records.encode_shard(images, labels, ids) == tensorflow_written_file(tmp_path, images, labels, ids)


def test_non_square_images_and_gzip_round_trip_through_tensorflow(tmp_path):
    import tensorflow as tf

    images = np.random.default_rng(4).integers(0, 256, size=(7, 8, 12, 3), dtype=np.uint8)
    content = records.encode_shard(images, [1, 2, 3, 4, 5, 6, 0], [f"x/{i}" for i in range(7)], "GZIP")
    assert content == records.encode_shard(images, [1, 2, 3, 4, 5, 6, 0], [f"x/{i}" for i in range(7)], "GZIP")
    path = tmp_path / "shard.tfrecord.gz"
    path.write_bytes(content)
    dataset = tf.data.TFRecordDataset(str(path), compression_type="GZIP").batch(7)
    parsed_images, parsed_labels = records.parse_batch(next(iter(dataset)), (8, 12, 3))
    np.testing.assert_array_equal(parsed_images.numpy(), images)
    assert parsed_labels.numpy().tolist() == [1, 2, 3, 4, 5, 6, 0]
    assert sum(1 for _ in records.iterate_records(content, records.COMPRESSION_GZIP)) == 7


def test_framing_errors_name_the_shard_and_the_record():
    images = np.zeros((3, 32, 32, 3), np.uint8)
    content = records.encode_shard(images, [0, 1, 2], ["a", "b", "c"])
    assert [len(payload) for payload in records.iterate_records(content)] == [len(content) // 3 - 16] * 3
    with pytest.raises(ValueError, match=r"my-shard: record 2 is truncated"):
        list(records.iterate_records(content[:-5], name="my-shard"))
    corrupted = bytearray(content)
    corrupted[len(content) // 3 + 40] ^= 1  # a byte inside record 1's payload
    with pytest.raises(ValueError, match=r"my-shard: record 1 fails its CRC32C check"):
        list(records.iterate_records(bytes(corrupted), name="my-shard"))


def test_wrong_image_size_is_refused():
    encoder = records.ExampleEncoder(32, 32, 3)
    with pytest.raises(ValueError, match=r"example 'x': image has 5 bytes, expected 3072"):
        encoder.encode(b"12345", 0, "x")


def test_labels_are_read_from_our_records_and_from_any_example():
    import tensorflow as tf

    encoder = records.ExampleEncoder(32, 32, 3)
    for label in (0, 9, 127, 128, 99_999):
        assert records.example_label(encoder.encode(bytes(3072), label, "batch/0001")) == label
    foreign = tf.train.Example(
        features=tf.train.Features(
            feature={
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[4])),
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\n\x05label" * 40])),
            }
        )
    )
    assert records.example_label(foreign.SerializeToString()) == 4
    unlabeled = tf.train.Example(features=tf.train.Features(feature={}))
    with pytest.raises(ValueError, match="no single int64 label"):
        records.example_label(unlabeled.SerializeToString())
