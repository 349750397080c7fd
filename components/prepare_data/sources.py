"""Reading CIFAR-10 from its official layouts, or images in class folders, into validated arrays.

Every reader returns a `RawDataset`: uint8 HWC images, int64 labels, stable ids, the label names, and
the source's own hold-out (data batch 5, or a `validation/` folder) as a mask over the training pool.
Anything malformed raises SourceError naming the file and the problem.
"""

from __future__ import annotations

import logging
import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from components.prepare_data.safe_io import FileTree, SourceError, load_numpy_pickle

logger = logging.getLogger(__name__)

CIFAR_SHAPE = (32, 32, 3)
CIFAR_PIXELS = 32 * 32 * 3
BINARY_RECORD_BYTES = 1 + CIFAR_PIXELS
TRAIN_BATCHES = tuple(f"data_batch_{index}" for index in range(1, 6))
HOLDOUT_BATCH = "data_batch_5"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
SPLIT_FOLDERS = {"train": "train", "validation": "validation", "val": "validation", "test": "eval", "eval": "eval"}


@dataclass
class RawSplit:
    images: np.ndarray  # uint8 [N, H, W, C]
    labels: np.ndarray  # int64 [N]
    ids: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, indices: np.ndarray) -> RawSplit:
        return RawSplit(self.images[indices], self.labels[indices], [self.ids[index] for index in indices])

    @staticmethod
    def concatenate(parts: list[RawSplit]) -> RawSplit:
        if not parts:
            return RawSplit(np.zeros((0, *CIFAR_SHAPE), np.uint8), np.zeros((0,), np.int64), [])
        return RawSplit(
            np.concatenate([part.images for part in parts]),
            np.concatenate([part.labels for part in parts]),
            [example_id for part in parts for example_id in part.ids],
        )


@dataclass
class RawDataset:
    dataset: str
    label_names: list[str]
    train: RawSplit  # the whole training pool, source hold-out included
    eval: RawSplit
    holdout: np.ndarray | None  # bool mask over `train`: the source's own validation split, if it has one
    source: dict[str, Any] = field(default_factory=dict)


def _check_labels(labels: np.ndarray, num_classes: int, origin: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels[(labels < 0) | (labels >= num_classes)][0])
        raise SourceError(f"{origin}: label {bad} is out of range; labels must be in [0, {num_classes - 1}]")


def check_classes_present(label_names: list[str], labels: np.ndarray, origin: str) -> None:
    counts = np.bincount(labels, minlength=len(label_names))
    empty = [label_names[index] for index in np.flatnonzero(counts == 0)]
    if empty:
        raise SourceError(f"{origin}: class(es) {empty} have no training images")


def _find_layout_dir(tree: FileTree, marker: str) -> str:
    """The folder (relative path, '' for the root) that holds `marker`, e.g. data_batch_1."""
    candidates = sorted({posixpath.dirname(name) for name in tree.names() if posixpath.basename(name) == marker})
    if not candidates:
        raise SourceError(f"{tree.origin}: no {marker} found")
    if len(candidates) > 1:
        raise SourceError(f"{tree.origin}: {marker} appears in several folders {candidates}; keep only one copy")
    return candidates[0]


def _join(folder: str, name: str) -> str:
    return posixpath.join(folder, name) if folder else name


# -- the official "python version" --------------------------------------------------------------------------


def read_python_batch(tree: FileTree, name: str, num_classes: int) -> RawSplit:
    origin = tree.describe(name)
    content = load_numpy_pickle(tree.read(name), origin)
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
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise SourceError(f"{origin}: b'labels' is not a list of integers ({error})") from error
    if labels.ndim != 1 or len(labels) != len(data):
        raise SourceError(f"{origin}: {len(labels)} labels for {len(data)} images; the counts must match")
    _check_labels(labels, num_classes, origin)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # R,G,B planes (CHW) -> HWC
    batch = posixpath.basename(name)
    return RawSplit(images, labels, [f"{batch}/{index:05d}" for index in range(len(labels))])


def read_python_layout(tree: FileTree) -> RawDataset:
    folder = _find_layout_dir(tree, "batches.meta")
    meta_origin = tree.describe(_join(folder, "batches.meta"))
    meta = load_numpy_pickle(tree.read(_join(folder, "batches.meta")), meta_origin)
    if not isinstance(meta, dict) or not isinstance(meta.get(b"label_names"), list):
        raise SourceError(f"{meta_origin}: expected a dict with b'label_names' (a list of class names)")
    label_names = [name.decode() if isinstance(name, bytes) else str(name) for name in meta[b"label_names"]]
    _require_files(tree, folder, [*TRAIN_BATCHES, "test_batch"])
    batches = [read_python_batch(tree, _join(folder, name), len(label_names)) for name in TRAIN_BATCHES]
    evaluation = read_python_batch(tree, _join(folder, "test_batch"), len(label_names))
    return _official_dataset(tree, "python", label_names, batches, evaluation)


def _require_files(tree: FileTree, folder: str, names: list[str]) -> None:
    present = set(tree.names())
    missing = [name for name in names if _join(folder, name) not in present]
    if missing:
        raise SourceError(f"{tree.origin}: missing {missing} in {folder or 'the top folder'}")


def _official_dataset(
    tree: FileTree, layout: str, label_names: list[str], batches: list[RawSplit], evaluation: RawSplit
) -> RawDataset:
    train = RawSplit.concatenate(batches)
    check_classes_present(label_names, train.labels, tree.origin)
    holdout = np.concatenate([np.full(len(batch), index == 4) for index, batch in enumerate(batches)])
    return RawDataset(
        dataset="cifar10",
        label_names=label_names,
        train=train,
        eval=evaluation,
        holdout=holdout,
        source={"format": layout, "holdout": HOLDOUT_BATCH},
    )


# -- the official "binary version" --------------------------------------------------------------------------


def read_binary_batch(tree: FileTree, name: str, num_classes: int) -> RawSplit:
    origin = tree.describe(name)
    content = tree.read(name)
    if len(content) == 0 or len(content) % BINARY_RECORD_BYTES:
        raise SourceError(
            f"{origin}: {len(content)} bytes is not a whole number of {BINARY_RECORD_BYTES}-byte records "
            "(1 label byte + 3072 pixel bytes); the file is truncated or not a CIFAR-10 binary batch"
        )
    records = np.frombuffer(content, dtype=np.uint8).reshape(-1, BINARY_RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    _check_labels(labels, num_classes, origin)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    batch = posixpath.basename(name).removesuffix(".bin")
    return RawSplit(images, labels, [f"{batch}/{index:05d}" for index in range(len(labels))])


def read_binary_layout(tree: FileTree) -> RawDataset:
    folder = _find_layout_dir(tree, "batches.meta.txt")
    label_names = [line.strip() for line in tree.read(_join(folder, "batches.meta.txt")).decode().splitlines()]
    label_names = [name for name in label_names if name]
    if not label_names:
        raise SourceError(f"{tree.describe(_join(folder, 'batches.meta.txt'))}: no class names")
    _require_files(tree, folder, [f"{name}.bin" for name in (*TRAIN_BATCHES, "test_batch")])
    batches = [read_binary_batch(tree, _join(folder, f"{name}.bin"), len(label_names)) for name in TRAIN_BATCHES]
    evaluation = read_binary_batch(tree, _join(folder, "test_batch.bin"), len(label_names))
    return _official_dataset(tree, "binary", label_names, batches, evaluation)


# -- images in class folders ------------------------------------------------------------------------------


def _image_kind(content: bytes) -> str | None:
    if content[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if content[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return None


def decode_image(content: bytes, origin: str) -> np.ndarray:
    """Decode one JPEG or PNG to uint8 [32, 32, 3]; any other content or size is an error naming `origin`."""
    import tensorflow as tf

    kind = _image_kind(content)
    if kind is None:
        raise SourceError(f"{origin}: not a JPEG or PNG image")
    try:
        decoder = tf.io.decode_jpeg if kind == "jpeg" else tf.io.decode_png
        image = decoder(content, channels=3).numpy()
    except tf.errors.OpError as error:
        raise SourceError(f"{origin}: could not decode the {kind.upper()} image ({error.message})") from error
    if image.shape != CIFAR_SHAPE:
        raise SourceError(f"{origin}: image is {image.shape[1]}x{image.shape[0]}, expected 32x32")
    return image


def _class_folder_layout(tree: FileTree) -> tuple[str, dict[str, dict[str, list[str]]]]:
    """Find `<root><split>/<class>/<file>` and group the files: {split: {class: [names]}}."""
    roots = set()
    for name in tree.names():
        parts = name.split("/")
        for depth in range(len(parts) - 2):
            if parts[depth] in SPLIT_FOLDERS and len(parts) - depth == 3:
                roots.add("/".join(parts[:depth]))
    if not roots:
        raise SourceError(
            f"{tree.origin}: no <split>/<class>/<image> files found (split folders: {sorted(SPLIT_FOLDERS)})"
        )
    if len(roots) > 1:
        raise SourceError(f"{tree.origin}: split folders found under several roots {sorted(roots)}; keep one")
    (root,) = roots
    prefix = f"{root}/" if root else ""
    groups: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in tree.names():
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        if parts[0] not in SPLIT_FOLDERS:
            continue
        if parts[-1].startswith("."):
            logger.info("skipping hidden file %s", tree.describe(name))
            continue
        if len(parts) != 3:
            raise SourceError(f"{tree.describe(name)}: expected <split>/<class>/<image>, the file is at another depth")
        groups[SPLIT_FOLDERS[parts[0]]][parts[1]].append(name)
    for directory in tree.directories():
        parts = directory[len(prefix) :].split("/") if directory.startswith(prefix) else []
        if len(parts) == 2 and parts[0] in SPLIT_FOLDERS and not groups[SPLIT_FOLDERS[parts[0]]].get(parts[1]):
            raise SourceError(f"{tree.describe(directory)}: class folder is empty")
    return root, groups


def read_class_folders(tree: FileTree) -> RawDataset:
    _root, groups = _class_folder_layout(tree)
    if "train" not in groups:
        raise SourceError(f"{tree.origin}: no train/ folder")
    if "eval" not in groups:
        raise SourceError(f"{tree.origin}: no test/ (or eval/) folder")
    label_names = sorted(groups["train"])
    for split in ("validation", "eval"):
        unknown = sorted(set(groups.get(split, {})) - set(label_names))
        if unknown:
            raise SourceError(f"{tree.origin}: {split} classes {unknown} have no train/ folder")
    splits: dict[str, RawSplit] = {}
    for split, classes in groups.items():
        names = [(name, label) for label, class_name in enumerate(label_names) for name in classes.get(class_name, [])]
        images = np.stack([decode_image(tree.read(name), tree.describe(name)) for name, _ in names])
        labels = np.array([label for _, label in names], dtype=np.int64)
        splits[split] = RawSplit(images, labels, [name for name, _ in names])
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


def detect_format(tree: FileTree) -> str:
    basenames = {posixpath.basename(name) for name in tree.names()}
    if "batches.meta" in basenames and "data_batch_1" in basenames:
        return "python"
    if "batches.meta.txt" in basenames and "data_batch_1.bin" in basenames:
        return "binary"
    return "folders"


READERS = {"python": read_python_layout, "binary": read_binary_layout, "folders": read_class_folders}


def read_tree(tree: FileTree, source_format: str = "auto") -> RawDataset:
    layout = detect_format(tree) if source_format == "auto" else source_format
    logger.info("reading %s as the %s layout", tree.origin, layout)
    return READERS[layout](tree)
