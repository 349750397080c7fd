"""Small CIFAR-10 sources in the official layouts, built by the tests themselves (no download, no shared data)."""

from __future__ import annotations

import io
import pickle
import socket
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parents[1]
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
BATCH_NAMES = [f"data_batch_{index}" for index in range(1, 6)] + ["test_batch"]
_REFUSING_SOCKETS: list[socket.socket] = []


@dataclass
class OfficialData:
    """What a test archive holds: per batch name, CHW-plane rows [N, 3072] and labels."""

    data: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]

    def image_hwc(self, example_id: str) -> np.ndarray:
        batch, index = example_id.split("/")
        return self.data[batch][int(index)].reshape(3, 32, 32).transpose(1, 2, 0)

    def label(self, example_id: str) -> int:
        batch, index = example_id.split("/")
        return int(self.labels[batch][int(index)])


def official_data(per_batch: int = 20, seed: int = 0, num_classes: int = 10) -> OfficialData:
    """Random pixels; every class appears in every batch (labels cycle), so no class is empty."""
    rng = np.random.default_rng(seed)
    data, labels = {}, {}
    for offset, name in enumerate(BATCH_NAMES):
        data[name] = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels[name] = (np.arange(per_batch) + offset) % num_classes
    return OfficialData(data, labels)


def add_member(archive: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(content), 1577836800, 0o644
    archive.addfile(info, io.BytesIO(content))


def python_batch_bytes(data: np.ndarray, labels, batch_label: str = "batch") -> bytes:
    return pickle.dumps(
        {
            b"batch_label": batch_label.encode(),
            b"labels": [label.item() if isinstance(label, np.generic) else label for label in labels],  # as given
            b"data": data,
            b"filenames": [f"image_{index}.png".encode() for index in range(len(labels))],
        },
        protocol=2,
    )


def python_meta_bytes(label_names=LABEL_NAMES) -> bytes:
    return pickle.dumps(
        {b"num_cases_per_batch": 10000, b"label_names": [name.encode() for name in label_names], b"num_vis": 3072},
        protocol=2,
    )


def write_python_archive(
    path: Path, official: OfficialData, overrides: dict[str, bytes] | None = None, extra=(), mode: str = "w:gz"
) -> Path:
    """An archive in the official "python version" layout; `overrides` replaces a member's bytes."""
    overrides = overrides or {}
    with tarfile.open(path, mode) as archive:
        members = {name: python_batch_bytes(official.data[name], official.labels[name]) for name in BATCH_NAMES}
        members["batches.meta"] = python_meta_bytes()
        members.update(overrides)
        for name, content in members.items():
            add_member(archive, f"cifar-10-batches-py/{name}", content)
        for member_function in extra:
            member_function(archive)
    return path


def write_binary_archive(path: Path, official: OfficialData, truncate: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name in BATCH_NAMES:
            records = np.concatenate(
                [official.labels[name].astype(np.uint8)[:, None], official.data[name]], axis=1
            ).tobytes()
            if name == truncate:
                records = records[:-100]
            add_member(archive, f"cifar-10-batches-bin/{name}.bin", records)
        add_member(archive, "cifar-10-batches-bin/batches.meta.txt", ("\n".join(LABEL_NAMES) + "\n").encode())
    return path


def encode_png(image: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_png(image).numpy()


def write_class_folders(
    root: Path, per_class: dict[str, int], classes=("cat", "dog", "frog"), seed: int = 0, size: int = 32
):
    """`root/<split>/<class>/<n>.png` (`size` x `size`) with random pixels; returns {relative path: HWC image}."""
    rng = np.random.default_rng(seed)
    written = {}
    for split, count in per_class.items():
        for class_name in classes:
            folder = root / split / class_name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                image = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
                (folder / f"{index:04d}.png").write_bytes(encode_png(image))
                written[f"{split}/{class_name}/{index:04d}.png"] = image
    return written


def tar_folder(root: Path, archive_path: Path, top: str = "") -> Path:
    with tarfile.open(archive_path, "w:gz") as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                add_member(archive, f"{top}{path.relative_to(root).as_posix()}", path.read_bytes())
    return archive_path


def read_records(files: list[str], compression: str = "NONE") -> dict[str, tuple[np.ndarray, int]]:
    """Every record of the shards, parsed with TensorFlow: {id: (HWC uint8 image, label)}."""
    import tensorflow as tf

    from components.common import records

    strings, integers = tf.io.FixedLenFeature([], tf.string), tf.io.FixedLenFeature([], tf.int64)
    feature_spec = {records.FEATURE_IMAGE: strings, records.FEATURE_ID: strings, records.FEATURE_LABEL: integers}
    feature_spec |= {key: integers for key in (records.FEATURE_HEIGHT, records.FEATURE_WIDTH, records.FEATURE_CHANNELS)}
    dataset = tf.data.TFRecordDataset(files, compression_type="" if compression == "NONE" else compression)
    result = {}
    for serialized in dataset:
        parsed = tf.io.parse_single_example(serialized, feature_spec)
        shape = [int(parsed[key]) for key in (records.FEATURE_HEIGHT, records.FEATURE_WIDTH, records.FEATURE_CHANNELS)]
        image = tf.io.decode_raw(parsed[records.FEATURE_IMAGE], tf.uint8).numpy().reshape(shape)
        result[parsed[records.FEATURE_ID].numpy().decode()] = (image, int(parsed[records.FEATURE_LABEL]))
    return result


# -- hostile sources: small files that would take far more memory than their size ------------------------------


def _tar_header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mtime, info.mode = size, kind, 1577836800, 0o644
    return info.tobuf(format=tarfile.GNU_FORMAT)


def write_gzip_bomb(path: Path, unpacked_bytes: int, name: str = "cifar-10-batches-py/data_batch_1") -> Path:
    """A .tar.gz of one member of `unpacked_bytes` zeros: about a thousandth of that on disk."""
    import zlib

    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 24)
    with open(path, "wb") as out:
        out.write(compressor.compress(_tar_header(name, unpacked_bytes)))
        for start in range(0, unpacked_bytes, len(chunk)):
            out.write(compressor.compress(chunk[: min(len(chunk), unpacked_bytes - start)]))
        out.write(compressor.compress(bytes(1024)))  # the end-of-archive blocks
        out.write(compressor.flush())
    return path


def write_sparse_tar(path: Path, apparent_bytes: int, name: str = "cifar-10-batches-py/data_batch_1") -> Path:
    """A few-KB tar whose one member is a GNU sparse file (PAX format 1.0) of `apparent_bytes`, nearly all hole."""
    sparse_map = b"1\n%d\n1\n" % (apparent_bytes - 1)  # one data region: the last byte
    sparse_map += bytes(-len(sparse_map) % 512)
    stored = sparse_map + b"x" + bytes(511)
    info = tarfile.TarInfo("GNUSparseFile.0/data")
    info.size, info.mtime, info.mode = len(sparse_map) + 1, 1577836800, 0o644
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(apparent_bytes),
    }
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    path.write_bytes(header + stored + bytes(1024))
    return path


def png_bomb(width: int, height: int) -> bytes:
    """A valid grayscale PNG of `width` x `height` zeros: a few hundred KB that decode to width*height bytes."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = bytes(width + 1)  # filter byte, then the pixels
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def jpeg_claiming_size(width: int, height: int) -> bytes:
    """A real 32x32 JPEG whose frame header claims `width` x `height`."""
    import struct

    import tensorflow as tf

    content = bytearray(tf.io.encode_jpeg(np.zeros((32, 32, 3), np.uint8)).numpy())
    offset = 2
    while content[offset + 1] not in (0xC0, 0xC1, 0xC2):
        offset += 2 + struct.unpack(">H", content[offset + 2 : offset + 4])[0]
    content[offset + 5 : offset + 9] = struct.pack(">HH", height, width)
    return bytes(content)


# -- training and its summaries --------------------------------------------------------------------------------


def tiny_train_config(data: str, model_dir, **overrides):
    """A ResNet-8 at quarter width that trains a step in milliseconds on a CPU."""
    from components.train.config import TrainConfig

    values = {
        "data": data,
        "model_dir": str(model_dir),
        "depth": 8,
        "width_multiplier": 0.25,
        "batch_size": 32,
        "train_steps": 10,
        "learning_rate": 0.05,
        "log_every_steps": 5,
        "summary_every_steps": 1,
        "histogram_every_steps": 0,
        "image_summaries": 0,
        "checkpoint_every_steps": 0,
        "checkpoint_every_seconds": None,
        "validation_every_steps": 0,
    }
    values.update(overrides)
    from components.common.config import config_from_mapping

    return config_from_mapping(TrainConfig, values, "test configuration")  # as every reader does: presets apply


def scalar_series(log_dir, tag) -> list[tuple[int, float]]:
    """(step, value) of a scalar summary as TensorBoard reads it."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    return [(event.step, tf.make_ndarray(event.tensor_proto).item()) for event in accumulator.Tensors(tag)]


def tiny_model(num_classes: int = 2):
    """A ResNet-8 at quarter width, untrained (for promotion and serving tests that need a model, not a good one)."""
    from components.common.model import ModelSpec, build_model

    return build_model(ModelSpec("resnet", depth=8, width_multiplier=0.25, num_classes=num_classes))


def interrupted_when(command: list[str], pattern: str, cwd, environment=None) -> tuple[int, str]:
    """Run `command` in a session of its own, as a terminal's foreground job, until a line of its output matches
    `pattern`; then Ctrl-C it (SIGINT to its process group). Returns its exit code and its whole output.

    A terminal's foreground job takes Ctrl-C with the default action, also when this suite runs as a background job
    (nohup, `make test &`), whose children start with SIGINT ignored and rightly keep ignoring it."""
    import os
    import re
    import signal
    import subprocess

    run = subprocess.Popen(
        command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines = []
    for line in run.stdout:
        lines.append(line)
        if re.search(pattern, line):
            break
    os.killpg(run.pid, signal.SIGINT)
    lines.append(run.communicate(timeout=180)[0])
    return run.returncode, "".join(lines)


def self_signed_certificate(folder) -> tuple[str, str]:
    """(certificate, key) files in `folder`: a self-signed certificate for 127.0.0.1, valid a day."""
    import subprocess
    from pathlib import Path

    certificate, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(certificate), str(key)


def refused_port() -> int:
    """A port on 127.0.0.1 where nothing listens for the rest of this test process: bound and never listening, so a
    connection is refused, and held, so that no other process (another test's server) can take it in the meantime
    (a port closed again after the probe can be)."""
    handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    handle.bind(("127.0.0.1", 0))
    _REFUSING_SOCKETS.append(handle)
    return handle.getsockname()[1]
