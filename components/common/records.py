"""The TFRecord schema every stage shares, and a fast, deterministic writer for it.

Each record is a serialized `tf.train.Example` with these features (schema version 1):

| feature    | type  | content                                                        |
|------------|-------|----------------------------------------------------------------|
| `image`    | bytes | raw uint8 pixels, height x width x channels (HWC), RGB order   |
| `label`    | int64 | class index into the manifest's `label_names`                  |
| `height`   | int64 | image height (32 for CIFAR-10)                                 |
| `width`    | int64 | image width (32)                                               |
| `channels` | int64 | 3                                                              |
| `id`       | bytes | stable example id, UTF-8, e.g. `data_batch_1/0042`             |

Records are encoded by hand (the protobuf wire format of `tf.train.Example` is small and fixed) and
framed in the TFRecord format with CRC32C, so that converting 60,000 images is a byte-join per image
rather than a protobuf object per image, and the bytes are identical on every run.

Over 300 lines: the schema, its encoder and two decoders (TensorFlow's and a wire-format label reader) must agree
byte for byte, so they stay side by side.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator, Sequence

import google_crc32c
import numpy as np

SCHEMA_VERSION = 1
FEATURE_IMAGE = "image"
FEATURE_LABEL = "label"
FEATURE_HEIGHT = "height"
FEATURE_WIDTH = "width"
FEATURE_CHANNELS = "channels"
FEATURE_ID = "id"
COMPRESSION_NONE = "NONE"
COMPRESSION_GZIP = "GZIP"
_CRC_MASK_DELTA = 0xA282EAD8


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field_tag: int, payload: bytes) -> bytes:
    return bytes([field_tag]) + _varint(len(payload)) + payload


def _feature_entry(key: str, feature: bytes) -> bytes:
    """One `map<string, Feature>` entry of `Features` (field 1), key in field 1, value in field 2."""
    entry = _length_delimited(0x0A, key.encode()) + _length_delimited(0x12, feature)
    return _length_delimited(0x0A, entry)


def bytes_feature(value: bytes) -> bytes:
    """A `Feature` holding a one-element `BytesList` (Feature field 1)."""
    return _length_delimited(0x0A, _length_delimited(0x0A, value))


def int64_feature(value: int) -> bytes:
    """A `Feature` holding a one-element packed `Int64List` (Feature field 3)."""
    return _length_delimited(0x1A, _length_delimited(0x0A, _varint(value)))


class ExampleEncoder:
    """Serializes (image, label, id) into Example bytes; the constant parts are built once.

    Entries are written in sorted key order, as protobuf's deterministic serialization orders map keys.
    """

    def __init__(self, height: int, width: int, channels: int):
        self.image_size = height * width * channels
        self._channels_and_height = _feature_entry(FEATURE_CHANNELS, int64_feature(channels)) + _feature_entry(
            FEATURE_HEIGHT, int64_feature(height)
        )
        self._width = _feature_entry(FEATURE_WIDTH, int64_feature(width))
        # The image entry's header depends only on the (fixed) image size.
        image_entry_example = _feature_entry(FEATURE_IMAGE, bytes_feature(bytes(self.image_size)))
        self._image_header = image_entry_example[: len(image_entry_example) - self.image_size]
        self._labels: dict[int, bytes] = {}

    def _label(self, label: int) -> bytes:
        entry = self._labels.get(label)
        if entry is None:
            entry = self._labels[label] = _feature_entry(FEATURE_LABEL, int64_feature(label))
        return entry

    def encode(self, image: bytes, label: int, example_id: str) -> bytes:
        if len(image) != self.image_size:
            raise ValueError(f"example {example_id!r}: image has {len(image)} bytes, expected {self.image_size}")
        features = b"".join(
            (
                self._channels_and_height,
                _feature_entry(FEATURE_ID, bytes_feature(example_id.encode())),
                self._image_header,
                image,
                self._label(label),
                self._width,
            )
        )
        return _length_delimited(0x0A, features)


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One record in the TFRecord file format: length, masked CRC of length, data, masked CRC of data."""
    header = struct.pack("<Q", len(data))
    return b"".join((header, struct.pack("<I", masked_crc32c(header)), data, struct.pack("<I", masked_crc32c(data))))


def encode_shard(
    images: np.ndarray, labels: Sequence[int], ids: Sequence[str], compression: str = COMPRESSION_NONE
) -> bytes:
    """A whole TFRecord file (optionally GZIP, with a fixed header so the bytes never vary) for `images`."""
    _count, height, width, channels = images.shape
    encoder = ExampleEncoder(height, width, channels)
    encoded_ids = [example_id.encode() for example_id in ids]
    labels = np.asarray(labels, dtype=np.int64)
    fixed_layout = len({len(example_id) for example_id in encoded_ids}) <= 1 and (
        labels.size == 0 or (labels.min() >= 0 and labels.max() < 128)
    )
    data = (
        _encode_fixed_layout(encoder, images, labels, encoded_ids)
        if fixed_layout
        else b"".join(
            frame_record(encoder.encode(image.tobytes(), int(label), example_id.decode()))
            for image, label, example_id in zip(images, labels, encoded_ids, strict=True)
        )
    )
    if compression == COMPRESSION_GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if compression != COMPRESSION_NONE:
        raise ValueError(f"compression {compression!r} is not one of {COMPRESSION_NONE}, {COMPRESSION_GZIP}")
    return data


def _encode_fixed_layout(encoder: ExampleEncoder, images: np.ndarray, labels: np.ndarray, ids: list[bytes]) -> bytes:
    """All records at once when every record has the same layout (equal id lengths, one-byte labels).

    One record is encoded the ordinary way to learn where the id, image and label bytes sit; then every
    record is that template with those columns replaced, and only the CRC32C is computed per record.
    """
    count = len(ids)
    if count == 0:
        return b""
    first_label = int(labels[0])
    template = np.frombuffer(frame_record(encoder.encode(images[0].tobytes(), first_label, ids[0].decode())), np.uint8)
    id_length, image_size = len(ids[0]), encoder.image_size
    id_entry = _feature_entry(FEATURE_ID, bytes_feature(ids[0]))
    label_entry = encoder._label(first_label)
    parts = (encoder._channels_and_height, id_entry, encoder._image_header, label_entry, encoder._width)
    payload_start, payload_end = 12, len(template) - 4
    features_start = payload_end - (sum(len(part) for part in parts) + image_size)  # after the Example header
    id_start = features_start + len(encoder._channels_and_height) + len(id_entry) - id_length
    image_start = id_start + id_length + len(encoder._image_header)
    label_position = image_start + image_size + len(label_entry) - 1
    frames = np.empty((count, len(template)), np.uint8)
    frames[:] = template
    frames[:, id_start : id_start + id_length] = np.frombuffer(b"".join(ids), np.uint8).reshape(count, id_length)
    frames[:, image_start : image_start + image_size] = np.ascontiguousarray(images, np.uint8).reshape(count, -1)
    frames[:, label_position] = labels
    crc = np.fromiter((google_crc32c.value(row) for row in frames[:, payload_start:payload_end]), np.uint32, count)
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_CRC_MASK_DELTA)
    frames[:, payload_end:] = masked.astype("<u4").view(np.uint8).reshape(count, 4)
    return frames.tobytes()


def iterate_records(content: bytes, compression: str = COMPRESSION_NONE, name: str = "shard") -> Iterator[bytes]:
    """Yield the record payloads of a TFRecord file's bytes, checking framing and CRCs; names `name` on error."""
    if compression == COMPRESSION_GZIP:
        try:
            content = zlib.decompress(content, wbits=zlib.MAX_WBITS | 16)
        except zlib.error as error:
            raise ValueError(f"{name}: not a valid GZIP stream: {error}") from error
    offset, size, index = 0, len(content), 0
    while offset < size:
        if offset + 12 > size:
            raise ValueError(f"{name}: truncated record header at byte {offset} (record {index})")
        header = content[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", content[offset + 8 : offset + 12])
        if header_crc != masked_crc32c(header):
            raise ValueError(f"{name}: corrupt length of record {index} at byte {offset}")
        end = offset + 12 + length + 4
        if end > size:
            raise ValueError(f"{name}: record {index} is truncated (needs {end} bytes, file has {size})")
        payload = content[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", content[end - 4 : end])
        if payload_crc != masked_crc32c(payload):
            raise ValueError(f"{name}: record {index} fails its CRC32C check")
        yield payload
        offset, index = end, index + 1


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data):
            raise ValueError("truncated varint")
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if not byte & 0x80:
            return value, offset
        shift += 7


def _length_delimited_fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in data[start:end]; other wire types skipped."""
    offset = start
    while offset < end:
        tag, offset = _read_varint(data, offset)
        wire_type = tag & 7
        if wire_type == 2:
            length, offset = _read_varint(data, offset)
            if offset + length > end:
                raise ValueError("field runs past its message")
            yield tag >> 3, offset, offset + length
            offset += length
        elif wire_type == 0:
            _, offset = _read_varint(data, offset)
        elif wire_type in (1, 5):
            offset += 8 if wire_type == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")


_LABEL_KEY = FEATURE_LABEL.encode()
# How ExampleEncoder ends every record when label and width are below 128: the label entry, then the width entry,
# 16 bytes each, of which only the last byte (the value) varies.
_LABEL_ENTRY_PREFIX = _feature_entry(FEATURE_LABEL, int64_feature(0))[:-1]
_WIDTH_ENTRY_PREFIX = _feature_entry(FEATURE_WIDTH, int64_feature(0))[:-1]


def example_label(record: bytes) -> int:
    """The `label` of one serialized Example. Records laid out as `ExampleEncoder` writes them are read from their
    last 32 bytes; any other is read by walking its wire format (no protobuf objects): Example.features (1) ->
    Features.feature entries (1) -> key (1) == "label", value (2) -> Feature.int64_list (3) -> Int64List.value
    (1, packed or not). ValueError when the record has no single int64 label."""
    if record[-32:-17] == _LABEL_ENTRY_PREFIX and record[-16:-1] == _WIDTH_ENTRY_PREFIX:
        return record[-17]
    for field, start, end in _length_delimited_fields(record, 0, len(record)):
        if field != 1:
            continue
        for entry_field, entry_start, entry_end in _length_delimited_fields(record, start, end):
            if entry_field != 1:
                continue
            key, value = None, None
            for part, part_start, part_end in _length_delimited_fields(record, entry_start, entry_end):
                if part == 1:
                    key = record[part_start:part_end]
                elif part == 2:
                    value = (part_start, part_end)
            if key != _LABEL_KEY or value is None:
                continue
            for kind, list_start, list_end in _length_delimited_fields(record, *value):
                if kind != 3:
                    continue
                values = [
                    _read_varint(record, value_start)[0]
                    for number, value_start, value_end in _length_delimited_fields(record, list_start, list_end)
                    if number == 1 and value_end > value_start
                ]
                if len(values) == 1:
                    label = values[0]
                    return label - (1 << 64) if label >= 1 << 63 else label
            break
    raise ValueError("record has no single int64 label")


def feature_spec():
    import tensorflow as tf

    return {
        FEATURE_IMAGE: tf.io.FixedLenFeature([], tf.string),
        FEATURE_LABEL: tf.io.FixedLenFeature([], tf.int64),
        FEATURE_HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        FEATURE_WIDTH: tf.io.FixedLenFeature([], tf.int64),
        FEATURE_CHANNELS: tf.io.FixedLenFeature([], tf.int64),
        FEATURE_ID: tf.io.FixedLenFeature([], tf.string),
    }


def parse_batch(serialized, image_shape: Sequence[int]):
    """Parse a batch of serialized records into (uint8 images [B, H, W, C], int64 labels [B])."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {FEATURE_IMAGE: tf.io.FixedLenFeature([], tf.string), FEATURE_LABEL: tf.io.FixedLenFeature([], tf.int64)},
    )
    images = tf.io.decode_raw(parsed[FEATURE_IMAGE], tf.uint8)
    images = tf.reshape(images, [-1, *image_shape])
    return images, parsed[FEATURE_LABEL]
