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

It owns the schema, its encoder and its two decoders (TensorFlow's and a wire-format label reader), which agree
byte for byte.
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
        return self.encode_bytes_id(image, label, example_id.encode())

    def encode_bytes_id(self, image: bytes, label: int, example_id: bytes) -> bytes:
        features = b"".join(
            (
                self._channels_and_height,
                _feature_entry(FEATURE_ID, bytes_feature(example_id)),
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


# How ExampleEncoder writes the label entry when the label is below 128: 16 bytes, of which the last is the value.
_LABEL_ENTRY_PREFIX = _feature_entry(FEATURE_LABEL, int64_feature(0))[:-1]


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if not byte & 0x80:
            return value, offset
        shift += 7


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int | tuple[int, int]]]:
    """(field number, wire type, value) of each field in data[start:end]: a varint's value, a length-delimited
    field's (start, end); fixed-width fields are skipped."""
    offset = start
    while offset < end:
        tag, offset = _read_varint(data, offset)
        wire_type = tag & 7
        if wire_type == 2:
            length, offset = _read_varint(data, offset)
            if offset + length > end:
                raise ValueError("field runs past its message")
            yield tag >> 3, 2, (offset, offset + length)
            offset += length
        elif wire_type == 0:
            value, offset = _read_varint(data, offset)
            yield tag >> 3, 0, value
        elif wire_type in (1, 5):
            offset += 8 if wire_type == 1 else 4
            if offset > end:
                raise ValueError("field runs past its message")
        else:
            raise ValueError(f"unsupported wire type {wire_type}")


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def example_features(record: bytes) -> dict[str, tuple[str, list[int]]]:
    """What each feature of a serialized Example holds, read from its wire format (no protobuf objects):
    {key: ("int64", values) | ("bytes", lengths of the values) | ("float", []) | ("empty", [])}. A key given twice
    keeps its last value, as protobuf maps do. ValueError when the bytes are not an Example."""
    features: dict[str, tuple[str, list[int]]] = {}
    for field, wire_type, example_value in _fields(record, 0, len(record)):
        if field != 1 or wire_type != 2:  # Example.features
            continue
        for entry_field, entry_type, entry in _fields(record, *example_value):
            if entry_field != 1 or entry_type != 2:  # Features.feature: map entries
                continue
            key, feature = None, None
            for part, part_type, value in _fields(record, *entry):
                if part_type == 2 and part == 1:
                    key = record[value[0] : value[1]].decode("utf-8", errors="replace")
                elif part_type == 2 and part == 2:
                    feature = value
            if key is None:
                continue
            kind, values = "empty", []
            for kind_field, kind_type, kind_value in _fields(record, *feature) if feature else ():
                if kind_type != 2:
                    continue
                if kind_field == 1:  # BytesList
                    kind = "bytes"
                    values = [end - start for number, wire, (start, end) in _fields(record, *kind_value) if number == 1]
                elif kind_field == 2:
                    kind, values = "float", []
                elif kind_field == 3:  # Int64List: packed or not
                    kind, values = "int64", []
                    for number, wire, value in _fields(record, *kind_value):
                        if number == 1 and wire == 0:
                            values.append(_int64(value))
                        elif number == 1 and wire == 2:
                            offset = value[0]
                            while offset < value[1]:
                                packed, offset = _read_varint(record, offset)
                                values.append(_int64(packed))
            features[key] = (kind, values)
    return features


def example_label(record: bytes) -> int:
    """The `label` of one serialized Example, whoever wrote it; ValueError when it has no single int64 label."""
    kind, values = example_features(record).get(FEATURE_LABEL, ("missing", []))
    if kind != "int64" or len(values) != 1:
        raise ValueError("record has no single int64 label")
    return values[0]


class RecordChecker:
    """Checks that records hold what a dataset of `image_shape` promises (a single int64 label; an image of exactly
    height x width x channels bytes; height, width and channels, where given, equal to the shape) and returns their
    labels. Records laid out as `ExampleEncoder` writes them are recognised by re-encoding them (a few microseconds);
    any other is read through its wire format."""

    def __init__(self, image_shape: Sequence[int]):
        self.image_shape = tuple(int(size) for size in image_shape)
        self._encoder = ExampleEncoder(*self.image_shape)

    def label(self, record: bytes) -> int:
        label = self._our_layout_label(record)
        return label if label is not None else self._any_layout_label(record)

    def _our_layout_label(self, record: bytes) -> int | None:
        """The label when `record` is exactly what ExampleEncoder writes for this shape (label below 128), else
        None. The id is found where the encoder puts it; the whole record is then compared with its re-encoding."""
        encoder = self._encoder
        try:
            if record[:1] != b"\x0a" or record[-32:-17] != _LABEL_ENTRY_PREFIX:
                return None
            _length, body = _read_varint(record, 1)
            id_entry = body + len(encoder._channels_and_height)
            # entry: 0x0A len (0x0A 0x02 "id" 0x12 len (0x0A len (0x0A len <id>)))
            _entry_length, key = _read_varint(record, id_entry + 1)
            _feature_length, feature = _read_varint(record, key + 4 + 1)
            _list_length, value = _read_varint(record, feature + 1)
            id_length, id_start = _read_varint(record, value + 1)
        except ValueError:
            return None
        label = record[-17]
        image_start = len(record) - 32 - encoder.image_size
        if image_start < id_start + id_length:
            return None
        expected = encoder.encode_bytes_id(record[image_start : image_start + encoder.image_size], label,
                                           record[id_start : id_start + id_length])  # fmt: skip
        return label if expected == record else None

    def _any_layout_label(self, record: bytes) -> int:
        features = example_features(record)
        kind, values = features.get(FEATURE_LABEL, ("missing", []))
        if kind != "int64" or len(values) != 1:
            raise ValueError(f"has no single int64 label ({kind} {values[:3]})")
        kind, lengths = features.get(FEATURE_IMAGE, ("missing", []))
        size = self._encoder.image_size
        if kind != "bytes" or lengths != [size]:
            described = f"{lengths[0]:,} bytes" if kind == "bytes" and len(lengths) == 1 else f"{kind} {lengths[:3]}"
            raise ValueError(
                f"its image is {described}, but the manifest's image_shape {list(self.image_shape)} needs {size:,}"
            )
        for key, expected in zip((FEATURE_HEIGHT, FEATURE_WIDTH, FEATURE_CHANNELS), self.image_shape, strict=True):
            kind, values = features.get(key, ("missing", []))
            if kind != "missing" and (kind != "int64" or values != [expected]):
                held = values[:3] if kind == "int64" else kind
                raise ValueError(f"its {key} is {held}, the manifest's image_shape says {expected}")
        return features[FEATURE_LABEL][1][0]


def parse_batch(serialized, image_shape: Sequence[int], with_ids: bool = False):
    """Parse a batch of serialized records into (uint8 images [B, H, W, C], int64 labels [B]), and string ids [B]
    `with_ids`."""
    import tensorflow as tf

    features = {FEATURE_IMAGE: tf.io.FixedLenFeature([], tf.string), FEATURE_LABEL: tf.io.FixedLenFeature([], tf.int64)}
    if with_ids:
        features[FEATURE_ID] = tf.io.FixedLenFeature([], tf.string)
    parsed = tf.io.parse_example(serialized, features)
    images = tf.io.decode_raw(parsed[FEATURE_IMAGE], tf.uint8)
    images = tf.reshape(images, [-1, *image_shape])
    if with_ids:
        return images, parsed[FEATURE_LABEL], parsed[FEATURE_ID]
    return images, parsed[FEATURE_LABEL]
