"""Reading CIFAR-10 from its official layouts, or images in class folders, into validated arrays.

Every reader returns a `RawDataset`: uint8 HWC images, int64 labels, stable ids, the label names, and
the source's own hold-out (data batch 5, or a `validation/` folder) as a mask over the training pool.
Anything malformed raises SourceError naming the file and the problem.

It owns every source layout (official python and binary archives, image folders) behind one reader, each bounded
in what it reads.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import struct
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from components.common.dataset import MAX_IMAGE_SIDE, check_label_names
from components.common.tensorflow_messages import what_tensorflow_said
from components.prepare_data.pixel_file import PixelFile
from components.prepare_data.safe_io import MEGABYTE, RAISE_THE_LIMIT, FileTree, SourceError, load_numpy_pickle

logger = logging.getLogger(__name__)

CIFAR_SHAPE = (32, 32, 3)
CIFAR_PIXELS = 32 * 32 * 3
BINARY_RECORD_BYTES = 1 + CIFAR_PIXELS
TRAIN_BATCHES = tuple(f"data_batch_{index}" for index in range(1, 6))
HOLDOUT_BATCH = "data_batch_5"
# The most a file of each kind may hold; nothing larger is read. An official batch holds 10,000 images.
MAX_BATCH_BYTES = 64 * MEGABYTE  # 31 MB in the official archives
MAX_META_BYTES = MEGABYTE  # a few hundred bytes of class names
MAX_IMAGE_BYTES = MEGABYTE  # a 32x32 image is a few KB, even uncompressed with metadata
MAX_RESIZED_IMAGE_BYTES = 32 * MEGABYTE  # with --resize, images of any size up to MAX_IMAGE_SIDE are read
# An image decodes to at most this many times its file's bytes (past a floor): photos decode to 5-50x, flat PNG
# drawings to a few hundred; a 49 KB PNG that decodes to 48 MB is a bomb.
MAX_DECODED_RATIO = 256
DECODED_FLOOR_BYTES = 4 * MEGABYTE
SPLIT_FOLDERS = {"train": "train", "validation": "validation", "val": "validation", "test": "eval", "eval": "eval"}
SPLIT_WORDS = {"train": "train/", "validation": "validation/", "eval": "test/"}  # a split, as its folder is called


@dataclass
class RawSplit:
    """Examples as positions in one or more image arrays; pixels are gathered only when a shard is encoded.

    Choosing, shuffling and joining splits therefore moves indices, not the pixels. A part is a uint8 [n, H, W, C]
    array (possibly a strided view, e.g. CHW planes as HWC), a `PixelFile`, or `FolderImages` (decoded when gathered).
    """

    parts: list
    labels: np.ndarray  # int64 [N], in this split's order
    ids: list[str]
    indices: np.ndarray  # int64 [N]: positions in the concatenation of `parts`
    resize_to: tuple[int, int] | None = None  # (height, width): pixels resized as they are gathered, a batch at a time

    @classmethod
    def from_array(cls, images, labels: np.ndarray, ids: list[str]) -> RawSplit:
        return cls([images], np.asarray(labels, np.int64), list(ids), np.arange(len(images)))

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_shape(self) -> tuple[int, ...]:
        shape = tuple(self.parts[0].shape[1:])
        return shape if self.resize_to is None else (*self.resize_to, shape[-1])

    def take(self, chosen: np.ndarray) -> RawSplit:
        chosen_ids = [self.ids[index] for index in chosen]
        return RawSplit(self.parts, self.labels[chosen], chosen_ids, self.indices[chosen], self.resize_to)

    def examples(self, selection: slice = slice(None)) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The examples in `selection`: uint8 [n, H, W, C] pixels gathered into one contiguous array (and resized,
        when the split is to be: a shard's worth at a time, so memory holds one shard, whatever the size), with the
        (height, width) [n, 2] and colour kind [n] each had in the source, before any resize or conversion (colours
        None: all RGB)."""
        wanted = self.indices[selection]
        if len(self.parts) == 1:
            gathered, sizes, colors = _gathered_from(self.parts[0], wanted)
        else:
            gathered, sizes, colors = self._gathered(wanted)
        return (gathered if self.resize_to is None else resized_in_batches(gathered, self.resize_to)), sizes, colors

    def _gathered(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        starts = np.cumsum([0] + [len(part) for part in self.parts[:-1]])
        owner = np.searchsorted(starts, wanted, side="right") - 1
        gathered = np.empty((len(wanted), *self.parts[0].shape[1:]), np.uint8)
        sizes = np.empty((len(wanted), 2), np.int64)
        colors = np.full(len(wanted), "RGB", dtype=object)
        plain = True
        for number, part in enumerate(self.parts):
            mine = owner == number
            if mine.any():
                gathered[mine], sizes[mine], part_colors = _gathered_from(part, wanted[mine] - starts[number])
                if part_colors is not None:
                    colors[mine], plain = part_colors, False
        return gathered, sizes, None if plain else colors

    @staticmethod
    def concatenate(splits: list[RawSplit]) -> RawSplit:
        parts, indices, offset = [], [], 0
        for split in splits:
            parts.extend(split.parts)
            indices.append(split.indices + offset)
            offset += sum(len(part) for part in split.parts)
        sizes = {split.resize_to for split in splits}
        if len(sizes) > 1:
            raise ValueError(f"splits to be joined are resized to different sizes {sorted(map(str, sizes))}")
        return RawSplit(
            parts,
            np.concatenate([split.labels for split in splits]),
            [example_id for split in splits for example_id in split.ids],
            np.concatenate(indices),
            sizes.pop() if sizes else None,
        )


def _gathered_from(part, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """part[wanted] as one contiguous uint8 [n, H, W, C] array, with the source sizes and colours (`examples`).
    CIFAR-10's colour planes (CHW) seen as HWC are gathered a whole image at a time and interleaved a plane at a
    time: 2-4x faster than element by element."""
    if isinstance(part, FolderImages):
        return part.gather(wanted)
    sizes = np.tile(np.array(part.shape[1:3], np.int64), (len(wanted), 1))
    if isinstance(part, PixelFile):
        return part.gather(wanted), sizes, None
    return _interleaved(part, wanted), sizes, None


def _interleaved(part: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    planar = part.transpose(0, 3, 1, 2)
    if not planar.flags.c_contiguous or part.flags.c_contiguous:
        return np.ascontiguousarray(part[wanted])
    planes = planar[wanted]
    gathered = np.empty((len(wanted), *part.shape[1:]), part.dtype)
    for channel in range(part.shape[3]):
        gathered[..., channel] = planes[:, channel]
    return gathered


class FolderImages:
    """A split folder's images, read from the source and decoded only when a shard gathers them: memory holds one
    shard's pixels whatever the folder's size, and a worker of a fanned-out prepare decodes only its own shards'.
    Every image must be `size` (height, width), or is resized to it when `resize`; the colour kind each had is kept,
    to be said once in the log (`log_conversions`)."""

    def __init__(self, tree: FileTree, names: list[str], size: tuple[int, int], resize: bool):
        self.tree, self.names, self.size, self.resize = tree, names, tuple(size), resize
        self.shape = (len(names), *self.size, 3)
        self.kinds: list[str] = []  # the colour kinds met, in the order met
        self.colors = np.full(len(names), -1, np.int16)  # per image: its kind's position in `kinds` (-1: not read)

    def __len__(self) -> int:
        return len(self.names)

    def gather(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        limit = MAX_RESIZED_IMAGE_BYTES if self.resize else MAX_IMAGE_BYTES
        images = np.empty((len(wanted), *self.shape[1:]), np.uint8)
        sizes = np.empty((len(wanted), 2), np.int64)
        colors = np.empty(len(wanted), dtype=object)
        for index, position in enumerate(np.asarray(wanted).tolist()):
            name = self.names[position]
            content = self.tree.read(name, limit, "an image")
            image, color = decode_image(content, self.tree.describe(name), None if self.resize else self.size)
            images[index] = resized(image[None], self.size)[0] if self.resize else image
            sizes[index], colors[index] = image.shape[:2], color
            if color not in self.kinds:
                self.kinds.append(color)
            self.colors[position] = self.kinds.index(color)
        return images, sizes, colors


@dataclass
class RawDataset:
    dataset: str
    label_names: list[str]
    train: RawSplit  # the whole training pool, source hold-out included
    eval: RawSplit
    holdout: np.ndarray | None  # bool mask over `train`: the source's own validation split, if it has one
    source: dict[str, Any] = field(default_factory=dict)


def integer_labels(values, origin: str) -> np.ndarray:
    """A batch's labels as int64, exactly: integers only (not floats, strings or booleans, which would be truncated
    or misread), each within int64 (the range is checked against the classes later). SourceError naming the first
    bad one otherwise."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise SourceError(f"{origin}: b'labels' must be a list of integers, got an array of {values.dtype}")
        if values.dtype.kind == "u" and len(values) and values.max() > np.iinfo(np.int64).max:
            bad = int(values[values > np.iinfo(np.int64).max][0])
            raise SourceError(f"{origin}: label {bad} is out of range; labels are class indexes")
        return values.astype(np.int64)
    if not isinstance(values, list | tuple):
        raise SourceError(f"{origin}: b'labels' must be a list of integers, got {type(values).__name__}")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise SourceError(
                f"{origin}: label {index} is {value!r:.40} ({type(value).__name__}), not an integer class index"
            )
        if not -(1 << 63) <= int(value) < 1 << 63:
            raise SourceError(f"{origin}: label {index} is {int(value)}, out of range; labels are class indexes")
    return np.asarray(values, dtype=np.int64)


def _check_labels(labels: np.ndarray, num_classes: int, origin: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels[(labels < 0) | (labels >= num_classes)][0])
        raise SourceError(f"{origin}: label {bad} is out of range; labels must be in [0, {num_classes - 1}]")


def checked_label_names(names: list, origin: str) -> list[str]:
    """Class names as the dataset will record them: distinct strings, also after Unicode normalisation."""
    check_label_names(names, lambda problem: SourceError(f"{origin}: {problem}"))
    return list(names)


def check_classes_present(label_names: list[str], labels: np.ndarray, origin: str) -> None:
    if not len(labels):
        raise SourceError(f"{origin}: the train split is empty (no training images at all)")
    counts = np.bincount(labels, minlength=len(label_names))
    empty = [label_names[index] for index in np.flatnonzero(counts == 0)]
    if empty:
        raise SourceError(f"{origin}: class(es) {empty} have no training images")


def _join(folder: str, name: str) -> str:
    return posixpath.join(folder, name) if folder else name


def _collect_layout(tree: FileTree, wanted: tuple[str, ...], read) -> tuple[str, dict[str, object]]:
    """Read the files named in `wanted` (basenames) in the order the source yields them.

    Returns their folder and {basename: read(name)}; all must sit in one folder, and all must exist.
    """
    folder: str | None = None
    found: dict[str, object] = {}
    for name in tree.iterate():
        base = posixpath.basename(name)
        if base not in wanted:
            continue
        directory = posixpath.dirname(name)
        if folder is not None and directory != folder:
            raise SourceError(f"{tree.origin}: CIFAR-10 files appear in several folders ({folder!r}, {directory!r})")
        folder = directory
        found[base] = read(name)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise SourceError(f"{tree.origin}: missing {missing} in {folder or 'the top folder'}")
    return folder or "", found


# -- the official "python version" --------------------------------------------------------------------------


def read_python_batch(tree: FileTree, name: str) -> RawSplit:
    origin = tree.describe(name)
    content = load_numpy_pickle(tree.read(name, MAX_BATCH_BYTES, "a CIFAR-10 batch"), origin)
    if not isinstance(content, dict) or b"data" not in content or b"labels" not in content:
        raise SourceError(f"{origin}: expected a dict with b'data' and b'labels' (a CIFAR-10 python batch)")
    data, labels = content[b"data"], content[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        described = f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}"
        raise SourceError(f"{origin}: b'data' must be a uint8 array [N, {CIFAR_PIXELS}], got {described}")
    if data.shape[1] != CIFAR_PIXELS:
        raise SourceError(
            f"{origin}: images have {data.shape[1]} values, expected {CIFAR_PIXELS} (32x32x3); wrong image size"
        )
    labels = integer_labels(labels, origin)
    if labels.ndim != 1 or len(labels) != len(data):
        raise SourceError(f"{origin}: {len(labels)} labels for {len(data)} images; the counts must match")
    batch = posixpath.basename(name)
    return RawSplit.from_array(on_disk(data), labels, [f"{batch}/{index:05d}" for index in range(len(labels))])


ON_DISK_IMAGES = 1024


def on_disk(planar: np.ndarray) -> PixelFile:
    """A batch's images, rows of R, G and B planes (CIFAR-10's CHW), as HWC images in a scratch file: the batch
    leaves memory as soon as it is read."""
    pixels, images = PixelFile(CIFAR_SHAPE), planar.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    for start in range(0, len(images), ON_DISK_IMAGES):  # interleaved a piece at a time: no second copy of the batch
        piece = images[start : start + ON_DISK_IMAGES]
        pixels.append(_interleaved(piece, np.arange(len(piece))))
    return pixels


def _python_label_names(tree: FileTree, name: str) -> list[str]:
    meta = load_numpy_pickle(tree.read(name, MAX_META_BYTES, "a list of class names"), tree.describe(name))
    if not isinstance(meta, dict) or not isinstance(meta.get(b"label_names"), list):
        raise SourceError(f"{tree.describe(name)}: expected a dict with b'label_names' (a list of class names)")
    names = []
    for index, label in enumerate(meta[b"label_names"]):
        if not isinstance(label, bytes | str):
            raise SourceError(f"{tree.describe(name)}: class name {index} is a {type(label).__name__}, not text")
        try:
            names.append(label.decode() if isinstance(label, bytes) else label)
        except UnicodeDecodeError as error:
            raise SourceError(f"{tree.describe(name)}: class name {index} is not UTF-8 ({error})") from error
    return checked_label_names(names, tree.describe(name))


def read_python_layout(tree: FileTree) -> RawDataset:
    def read(name: str):
        return _python_label_names(tree, name) if name.endswith("batches.meta") else read_python_batch(tree, name)

    folder, found = _collect_layout(tree, (*TRAIN_BATCHES, "test_batch", "batches.meta"), read)
    batches = {name: found[name] for name in (*TRAIN_BATCHES, "test_batch")}
    return _official_dataset(tree, folder, "python", found["batches.meta"], batches)


def _official_dataset(
    tree: FileTree, folder: str, layout: str, label_names: list[str], batches: dict[str, RawSplit]
) -> RawDataset:
    suffix = ".bin" if layout == "binary" else ""
    for name, batch in batches.items():
        _check_labels(batch.labels, len(label_names), tree.describe(_join(folder, name + suffix)))
    train = RawSplit.concatenate([batches[name] for name in TRAIN_BATCHES])
    check_classes_present(label_names, train.labels, tree.origin)
    holdout = np.concatenate([np.full(len(batches[name]), name == HOLDOUT_BATCH) for name in TRAIN_BATCHES])
    return RawDataset(
        dataset="cifar10",
        label_names=label_names,
        train=train,
        eval=batches["test_batch"],
        holdout=holdout,
        source={"format": layout, "holdout": HOLDOUT_BATCH},
    )


# -- the official "binary version" --------------------------------------------------------------------------


def read_binary_batch(tree: FileTree, name: str) -> RawSplit:
    origin = tree.describe(name)
    content = tree.read(name, MAX_BATCH_BYTES, "a CIFAR-10 batch")
    if len(content) == 0 or len(content) % BINARY_RECORD_BYTES:
        raise SourceError(
            f"{origin}: {len(content)} bytes is not a whole number of {BINARY_RECORD_BYTES}-byte records "
            "(1 label byte + 3072 pixel bytes); the file is truncated or not a CIFAR-10 binary batch"
        )
    records = np.frombuffer(content, dtype=np.uint8).reshape(-1, BINARY_RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    batch = posixpath.basename(name).removesuffix(".bin")
    return RawSplit.from_array(
        on_disk(records[:, 1:]), labels, [f"{batch}/{index:05d}" for index in range(len(labels))]
    )


def _binary_label_names(tree: FileTree, name: str) -> list[str]:
    text = tree.read(name, MAX_META_BYTES, "a list of class names").decode(errors="replace")
    label_names = [line.strip() for line in text.splitlines() if line.strip()]
    if not label_names:
        raise SourceError(f"{tree.describe(name)}: no class names")
    return checked_label_names(label_names, tree.describe(name))


def read_binary_layout(tree: FileTree) -> RawDataset:
    def read(name: str):
        return _binary_label_names(tree, name) if name.endswith(".txt") else read_binary_batch(tree, name)

    wanted = (*(f"{name}.bin" for name in (*TRAIN_BATCHES, "test_batch")), "batches.meta.txt")
    folder, found = _collect_layout(tree, wanted, read)
    batches = {name: found[f"{name}.bin"] for name in (*TRAIN_BATCHES, "test_batch")}
    return _official_dataset(tree, folder, "binary", found["batches.meta.txt"], batches)


# -- images in class folders ------------------------------------------------------------------------------


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_COLOR_TYPES = {0: "grayscale", 2: "RGB", 3: "palette", 4: "grayscale with alpha", 6: "RGBA"}
JPEG_COMPONENTS = {1: "grayscale", 3: "RGB", 4: "CMYK"}
# Start-of-frame markers, which carry the size: C0-CF except C4 (Huffman tables), C8 (reserved), CC (arithmetic).
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
JPEG_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD9)})


@dataclass(frozen=True)
class ImageHeader:
    """What an image file says of itself before any pixel is decoded."""

    kind: str  # "png" or "jpeg"
    width: int
    height: int
    color: str  # "RGB", "grayscale", "RGBA", ...


def _png_header(content: bytes, origin: str) -> ImageHeader:
    if len(content) < 33 or content[12:16] != b"IHDR":
        raise SourceError(f"{origin}: PNG has no image header (IHDR); the file is truncated or corrupt")
    width, height, _depth, color_type = struct.unpack(">IIBB", content[16:26])
    return ImageHeader("png", width, height, PNG_COLOR_TYPES.get(color_type, f"color type {color_type}"))


def _jpeg_header(content: bytes, origin: str) -> ImageHeader:
    """Walk the JPEG's marker segments to its frame header (SOFn), which gives the size."""
    offset = 2
    while offset + 4 <= len(content):
        if content[offset] != 0xFF:
            break
        marker = content[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in JPEG_STANDALONE_MARKERS:
            offset += 2
            continue
        (length,) = struct.unpack(">H", content[offset + 2 : offset + 4])
        if marker in JPEG_FRAME_MARKERS and offset + 10 <= len(content):
            height, width, components = struct.unpack(">HHB", content[offset + 5 : offset + 10])
            return ImageHeader("jpeg", width, height, JPEG_COMPONENTS.get(components, f"{components} components"))
        if marker == 0xDA or length < 2:  # start of scan before any frame header, or a broken segment
            break
        offset += 2 + length
    raise SourceError(f"{origin}: JPEG has no readable frame header; the file is truncated or corrupt")


def read_image_header(content: bytes, origin: str) -> ImageHeader:
    """The image's kind, size and colors from its header; anything but a JPEG or PNG is an error."""
    if content[:8] == PNG_SIGNATURE:
        return _png_header(content, origin)
    if content[:3] == b"\xff\xd8\xff":
        return _jpeg_header(content, origin)
    if not content:
        raise SourceError(f"{origin}: an empty file, not a JPEG or PNG image")
    kind = _other_kind(content)
    if kind:
        raise SourceError(f"{origin}: a {kind} image; only JPEG and PNG are read (convert it to PNG)")
    raise SourceError(f"{origin}: not a JPEG or PNG image")


# The signatures of image formats a folder of images often holds besides JPEG and PNG: (prefix, offset, name)
OTHER_IMAGE_KINDS = (
    (b"GIF87a", 0, "GIF"), (b"GIF89a", 0, "GIF"), (b"BM", 0, "BMP"), (b"WEBP", 8, "WebP"), (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"), (b"ftypheic", 4, "HEIC"), (b"ftypheix", 4, "HEIC"), (b"ftypmif1", 4, "HEIF"),
    (b"ftypavif", 4, "AVIF"), (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"), (b"\xff\x0a", 0, "JPEG XL"),
    (b"8BPS", 0, "Photoshop"), (b"\x00\x00\x01\x00", 0, "ICO"),
)  # fmt: skip


def _other_kind(content: bytes) -> str | None:
    for prefix, offset, name in OTHER_IMAGE_KINDS:
        if content[offset : offset + len(prefix)] == prefix:
            return name
    return None


def decode_image(content: bytes, origin: str, size: tuple[int, int] | None) -> tuple[np.ndarray, str]:
    """Decode one JPEG or PNG to uint8 [height, width, 3], and say what colors it had. `size` (height, width) is the
    size every image must have; None: any, up to MAX_IMAGE_SIDE (to be resized). The size is checked from the header
    before decoding, so no image larger than allowed is ever decoded."""
    import tensorflow as tf

    header = read_image_header(content, origin)
    if size is not None and (header.height, header.width) != size:
        raise SourceError(
            f"{origin}: image is {header.width}x{header.height} (width x height), the others {size[1]}x{size[0]}; give "
            "--resize HEIGHTxWIDTH to resize every image to one size, or make them one size"
        )
    if not (1 <= header.height <= MAX_IMAGE_SIDE and 1 <= header.width <= MAX_IMAGE_SIDE):
        raise SourceError(
            f"{origin}: image is {header.width}x{header.height}; sides above {MAX_IMAGE_SIDE} are refused"
        )
    decoded = header.width * header.height * 3
    if decoded > max(DECODED_FLOOR_BYTES, MAX_DECODED_RATIO * len(content)):
        raise SourceError(
            f"{origin}: a {len(content):,}-byte image that decodes to {header.width}x{header.height} ({decoded:,} "
            f"bytes, more than {MAX_DECODED_RATIO} times its size); refusing a likely decompression bomb"
        )
    try:
        decoder = tf.io.decode_jpeg if header.kind == "jpeg" else tf.io.decode_png
        image = decoder(tf.constant(content), channels=3).numpy()  # a tensor: bytes take the slow path (+40%)
    except tf.errors.OpError as error:
        said = what_tensorflow_said(error.message, "the decoder refused it")
        raise SourceError(f"{origin}: could not decode the {header.kind.upper()} image ({said})") from error
    if image.shape[:2] != (header.height, header.width):
        raise SourceError(f"{origin}: decodes to {image.shape[1]}x{image.shape[0]}, its header says otherwise")
    return image, header.color


def resized(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [N, H, W, 3] at `size`, the project's one resize (common/pixels.py: what a served model does too)."""
    from components.common.pixels import resize_images

    if images.shape[1:3] == size:
        return images
    return resize_images(images, *size).numpy()


COLOR_CONVERSIONS = {
    "grayscale": "the gray value copied into R, G and B",
    "grayscale with alpha": "the gray value copied into R, G and B, transparency dropped",
    "RGBA": "transparency dropped",
    "palette": "the palette looked up, any transparency dropped",
    "CMYK": "converted by the JPEG decoder",
}


def log_conversions(*splits: RawSplit) -> None:
    """Say which of the images decoded so far were not RGB, how many, and what their conversion did (each image
    once, however often it was gathered; the first named in the source's order)."""
    found: dict[str, tuple[int, str]] = {}
    parts = list({id(part): part for split in splits for part in split.parts}.values())
    for part in parts:
        if not isinstance(part, FolderImages):
            continue
        for code, color in enumerate(part.kinds):
            chosen = np.flatnonzero(part.colors == code)
            count, first = found.get(color, (0, part.tree.describe(part.names[chosen[0]])))
            found[color] = (count + len(chosen), first)
    for color, (count, first) in sorted(found.items()):
        if color != "RGB":
            how = COLOR_CONVERSIONS.get(color, "converted by the decoder")
            logger.warning("%d %s image(s) converted to RGB (%s), e.g. %s", count, color, how, first)


def _first_size(tree: FileTree, groups: dict[str, dict[str, list[str]]], label_names: list[str]) -> tuple[int, int]:
    """The (height, width) of the first image of the first split (from its header): the size every image must have
    when they are not resized."""
    split = next(iter(groups.values()))
    name = next(name for class_name in label_names for name in split.get(class_name, []))
    header = read_image_header(tree.read(name, MAX_IMAGE_BYTES, "an image"), tree.describe(name))
    return header.height, header.width


# What an operating system or a tool leaves among a user's images (besides hidden files and folders, whose names
# start with "."): never a class, never an image.
SYSTEM_NAMES = frozenset({"__macosx", "thumbs.db", "ehthumbs.db", "desktop.ini"})


def left_by_a_tool(name: str) -> bool:
    """A path with a hidden part (.ipynb_checkpoints/, .git/, ._photo.png, .DS_Store) or an operating system's own
    file or folder (__MACOSX/, Thumbs.db, desktop.ini)."""
    return any(
        (part.startswith(".") and part != ".") or part.lower() in SYSTEM_NAMES for part in name.split("/") if part
    )


def _class_folder_layout(tree: FileTree) -> tuple[str, dict[str, dict[str, list[str]]]]:
    """Find `<root><split>/<class>/<file>` and group the files: {split: {class: [names]}}; what a tool or an
    operating system left among them (`left_by_a_tool`) is skipped, said once in the log."""
    visible, skipped = [], []
    for name in tree.names():
        (skipped if left_by_a_tool(name) else visible).append(name)
    if skipped:
        logger.info("skipping %d hidden or system file(s), e.g. %s", len(skipped), tree.describe(skipped[0]))
    roots = set()
    for name in visible:
        parts = name.split("/")
        for depth in range(len(parts) - 2):
            if parts[depth].lower() in SPLIT_FOLDERS and len(parts) - depth == 3:
                roots.add("/".join(parts[:depth]))
    if not roots:
        flat = sorted({name.split("/")[-2] for name in visible if "/" in name})
        if flat:  # class folders of images, as many tools lay them out, without the split folders above them
            shown_classes = ", ".join(f"{name}/" for name in flat[:3]) + (", ..." if len(flat) > 3 else "")
            raise SourceError(
                f"{tree.origin}: holds class folders ({shown_classes}) but no split folders above them: put them "
                f"under train/ and test/ (<split>/<class>/<image>: the test images are what the model is evaluated "
                f"on; split folders: {sorted(SPLIT_FOLDERS)})"
            )
        raise SourceError(
            f"{tree.origin}: no <split>/<class>/<image> files found (split folders: {sorted(SPLIT_FOLDERS)})"
        )
    if len(roots) > 1:
        raise SourceError(f"{tree.origin}: split folders found under several roots {sorted(roots)}; keep one")
    (root,) = roots
    prefix = f"{root}/" if root else ""
    groups: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    spelled: dict[str, set[str]] = defaultdict(set)  # each split's folder names as the source spells them
    for name in visible:
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        if parts[0].lower() not in SPLIT_FOLDERS:
            continue
        spelled[SPLIT_FOLDERS[parts[0].lower()]].add(parts[0])
        if len(parts) != 3:
            raise SourceError(f"{tree.describe(name)}: expected <split>/<class>/<image>, the file is at another depth")
        groups[SPLIT_FOLDERS[parts[0].lower()]][parts[1]].append(name)
    for split, folders in spelled.items():
        if len(folders) > 1:
            raise SourceError(f"{tree.origin}: {', '.join(f'{folder}/' for folder in sorted(folders))} hold the same "
                              f"split ({split}); keep one")  # fmt: skip
    for directory in tree.directories():
        if left_by_a_tool(directory[len(prefix) :]):
            continue
        parts = directory[len(prefix) :].split("/") if directory.startswith(prefix) else []
        split = SPLIT_FOLDERS.get(parts[0].lower()) if parts else None
        if len(parts) == 2 and split and not groups[split].get(parts[1]):
            raise SourceError(f"{tree.describe(directory)}: class folder is empty")
    return root, groups


def read_class_folders(tree: FileTree, image_size: tuple[int, int] | None, max_decoded_bytes: int) -> RawDataset:
    """Images in <split>/<class>/ folders, each resized to `image_size` when given; else all of one size (the
    first image's), which is then the model's input size. The pixels of all the splits, decoded, are refused above
    `max_decoded_bytes` before any image of a split is decoded (compressed images take ten times their files)."""
    _root, groups = _class_folder_layout(tree)
    if "train" not in groups:
        raise SourceError(f"{tree.origin}: no train/ folder")
    if "eval" not in groups:
        raise SourceError(f"{tree.origin}: no test/ (or eval/) folder")
    label_names = checked_label_names(sorted(groups["train"]), f"{tree.origin} (the train/ class folders)")
    folded: dict[str, str] = {}
    for name in label_names:  # two folders of one class, which a Mac's or Windows' file system cannot even hold
        if name.casefold() in folded:
            raise SourceError(f"{tree.origin}: train/ classes {folded[name.casefold()]!r} and {name!r} differ only in "
                              "case: merge the two folders, or rename one")  # fmt: skip
        folded[name.casefold()] = name
    for split in ("validation", "eval"):
        unknown = sorted(set(groups.get(split, {})) - set(label_names))
        spelled = {unicodedata.normalize("NFKC", name): name for name in label_names}
        for name in unknown:
            if unicodedata.normalize("NFKC", name) in spelled:
                raise SourceError(
                    f"{tree.origin}: {SPLIT_WORDS[split]} class {name!r} is written with other Unicode characters "
                    f"than train/'s {spelled[unicodedata.normalize('NFKC', name)]!r} (one decomposed, as macOS writes "
                    "names, the other composed): rename one folder so that both are spelled the same"
                )
        if unknown:
            raise SourceError(f"{tree.origin}: {SPLIT_WORDS[split]} classes {unknown} have no train/ folder")
    untested = [name for name in label_names if name not in groups["eval"]]
    if untested:
        logger.warning("%s: class(es) %s have no test images: their accuracy will not be measured", tree.origin,
                       untested)  # fmt: skip
    splits: dict[str, RawSplit] = {}
    common_size = image_size or _first_size(tree, groups, label_names)  # without resizing, every image's size
    decoded = 0  # bytes the splits so far take decoded
    for split, classes in groups.items():
        names = [(name, label) for label, class_name in enumerate(label_names) for name in classes.get(class_name, [])]
        origin = tree.describe(names[0][0])
        decoded += _decoded_bytes(len(names), common_size, origin, decoded, max_decoded_bytes)
        images = FolderImages(tree, [name for name, _ in names], common_size, resize=image_size is not None)
        labels = np.array([label for _, label in names], dtype=np.int64)
        splits[split] = RawSplit.from_array(images, labels, [name for name, _ in names])
    pool = [splits["train"]]
    holdout = None
    if "validation" in splits:
        pool.append(splits["validation"])
        holdout = np.concatenate([np.zeros(len(splits["train"]), bool), np.ones(len(splits["validation"]), bool)])
    train = RawSplit.concatenate(pool)
    return RawDataset(
        dataset="images",
        label_names=label_names,
        train=train,
        eval=splits["eval"],
        holdout=holdout,
        source={"format": "folders", "holdout": "validation/" if holdout is not None else None},
    )


# -- detection --------------------------------------------------------------------------------------------

PYTHON_FILES = {*TRAIN_BATCHES, "test_batch", "batches.meta"}
BINARY_FILES = {*(f"{name}.bin" for name in (*TRAIN_BATCHES, "test_batch")), "batches.meta.txt"}


def detect_format(tree: FileTree) -> str:
    """The layout of the first recognizable file: python or binary batches, else class folders."""
    for name in tree.iterate():
        base = posixpath.basename(name)
        if base in PYTHON_FILES:
            return "python"
        if base in BINARY_FILES:
            return "binary"
    return "folders"


READERS = {"python": read_python_layout, "binary": read_binary_layout, "folders": read_class_folders}


def _decoded_bytes(count: int, size: tuple[int, int], origin: str, before: int, max_decoded_bytes: int) -> int:
    """The bytes `count` images of `size` take decoded, refused when with the `before` bytes of the splits already
    read they are more than `max_decoded_bytes`: the source's own bound, which the step's memory is sized for."""
    needed = count * size[0] * size[1] * 3
    if before + needed > max_decoded_bytes:
        others = f", and the splits before it {before / MEGABYTE:,.1f} MB," if before else ""
        raise SourceError(
            f"{origin}: {count:,} images of {size[1]}x{size[0]} take {needed / MEGABYTE:,.1f} MB decoded{others} more "
            f"than the source's bound of {max_decoded_bytes // MEGABYTE:,} MB; give --resize with a smaller size, or "
            f"{RAISE_THE_LIMIT}"
        )
    return needed


def read_tree(
    tree: FileTree, source_format: str, image_size: tuple[int, int] | None, max_decoded_bytes: int
) -> RawDataset:
    """The source as a RawDataset, every image at `image_size` when given (folders are resized as they are read and
    bounded by `max_decoded_bytes` decoded; CIFAR-10's batches afterwards, as their shards are written)."""
    layout = detect_format(tree) if source_format == "auto" else source_format
    logger.info("reading %s as the %s layout", tree.origin, layout)
    if layout == "folders":
        return read_class_folders(tree, image_size, max_decoded_bytes)
    raw = READERS[layout](tree)
    return resized_dataset(raw, image_size) if image_size else raw


def resized_dataset(raw: RawDataset, size: tuple[int, int]) -> RawDataset:
    """`raw` with every image to be resized to `size` (the splits keep their order, ids and labels); the pixels are
    resized when a shard gathers them (`RawSplit.images`), never the whole dataset at once."""
    if raw.train.image_shape[:2] == size and raw.eval.image_shape[:2] == size:
        return raw
    logger.info("resizing %d images to %dx%d as their shards are written", len(raw.train) + len(raw.eval), *size)
    return dataclasses.replace(
        raw,
        train=dataclasses.replace(raw.train, resize_to=size),
        eval=dataclasses.replace(raw.eval, resize_to=size),
    )


RESIZE_BATCH_BYTES = 64 << 20  # of float32 pixels a resize batch may hold (source and result), whatever the sizes


def resized_in_batches(images: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [N, H, W, C] at `size`, resized in batches of at most RESIZE_BATCH_BYTES of float32 pixels."""
    if images.shape[1:3] == size:
        return images
    result = np.empty((len(images), *size, images.shape[-1]), np.uint8)
    per_image = 4 * images.shape[-1] * (images.shape[1] * images.shape[2] + size[0] * size[1])
    batch = max(1, RESIZE_BATCH_BYTES // per_image)
    for start in range(0, len(images), batch):
        result[start : start + batch] = resized(images[start : start + batch], size)
    return result
