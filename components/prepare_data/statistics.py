"""What a prepared dataset holds, as data: counts, pixels, sizes, duplicates and leakage (statistics.json).

Computed by prepare_data from the pixels it gathers anyway, a shard's worth at a time, before the shards are written
(so that leaking images can be dropped from them): per split and class the counts; per channel the mean and standard
deviation, overall and per class; per class a mean 8x8 thumbnail (what the class looks like, to notice labels that
moved); how the images look, at 32x32: a histogram of each channel's values, of each pixel's colour saturation and of
each image's fine detail, and per image its brightness, contrast, saturation and detail (their means and spreads over
the images, which say how far a mean may move by chance); the images' sizes, aspect ratios and colour conversions as
the source had them, before any resize; exact
duplicates (the same pixels) and near-duplicates within each split and across splits. A near-duplicate of a
validation or test image in the training split is leakage, and `leakage` counts, per split other than train, the
images that have one.

Near-duplicates, the method. Each image becomes a 63-value descriptor: its luminance at 32x32, the 8x8 lowest
frequencies of its 2-D DCT (pHash's coefficients) without the DC term, each weighted by (u^2 + v^2)^(1/4) (which
flattens halfway the 1/f amplitude spectrum every natural image has, so that unrelated images stop looking alike
merely for having a bright sky above a dark ground), scaled to unit length. Two images are near-duplicates when
their descriptors' cosine similarity is at least NEAR_DUPLICATE_THRESHOLD. What this is robust to, and why:
brightness (adding a constant moves only the DC term, which is dropped), contrast (scaling all pixels scales every
coefficient, undone by the unit length), JPEG re-encoding (it changes high frequencies; the 8x8 lowest barely), a
one-pixel shift (mostly: a shift turns the phase of the lowest frequencies least). It is the continuous form of the
perceptual hash pHash, compared by cosine rather than by Hamming distance of sign bits: on 32x32 images the sign bits
of near-duplicates differ in 8-16 of 64 places, so a bit hash cannot tell them from unrelated images, while the
cosine can. Measured on CIFAR-10 (docs/prepare_data.md): JPEG quality 50 keeps 98% of images above 0.99, +30
brightness above 0.99, and the threshold 0.9 finds 2.9% of the test images in the training set, close to the 3.3%
Barz and Denzler found by hand.

The search (`near_duplicate_pairs`) runs once over the images of all splits together: exhaustive up to
EXHAUSTIVE_LIMIT images, beyond that within cells of about CELL_IMAGES similar descriptors, each image compared with
the images of its SEARCH_PROBES nearest cells, so that its time grows linearly with the images (bench/scale.py: 99.2%
of the exhaustive search's pairs at 600,000 images, in 10 s); the pairs are then sorted into within-split and
across-split comparisons.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import itertools
import json
import logging
import math
import os
import tempfile
import threading
import weakref
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from components.common.data_statistics import PER_IMAGE
from components.common.progress import Progress

logger = logging.getLogger(__name__)

STATISTICS_VERSION = 2  # 2: the look of the images (histograms, saturation, contrast, detail); 1 is still read
FEATURE_SIDE = 32  # descriptors are computed at 32x32 luminance, whatever the image size
DCT_SIZE = 8
NEAR_DUPLICATE_THRESHOLD = 0.9
THUMBNAIL_SIDE = 8  # class mean images: 8x8x3 values each
LISTED_PAIRS = 500  # pairs listed per comparison (all are counted)
LISTED_LEAKING = 20_000  # ids of leaking images listed per split (all are counted): at most about 1 MB
EXHAUSTIVE_LIMIT = 8192  # images up to which every pair is compared
CELL_IMAGES = 512  # images a cell, at any size
SEARCH_PROBES = 6  # cells each image is compared with (bench/scale.py: recall 0.99 at 600,000 images)
FLAT_CELLS = 256  # up to this many cells, an image's nearest are found among all of them; beyond, among groups'
GROUP_PROBES = 4  # groups of cells among whose cells an image's nearest are found
SAMPLE_PER_CELL = 40  # descriptors the cells' centres are fitted on, per cell
SAMPLE_FLOOR = 20_480
SEARCH_BLOCK = 2048
DESCRIPTOR_DTYPE = np.float16  # as the descriptors are kept (cosines within 1e-3 of float32's), half the memory
SEARCH_THREADS = min(4, os.cpu_count() or 1)  # cells compared at once (numpy lets go of the GIL), 20 MB each
NEAREST_ROWS = 16_384  # descriptors whose nearest cells are found at a time
RELEASE_BATCHES = 64  # batches of descriptors joined between two releases of the memory they held
SCORE_ELEMENTS = 1 << 20  # scores computed at a time (4 MB of float32, a thread)
CHUNK_BYTES = 32 << 20  # of float pixels converted at a time
HISTOGRAM_BINS = 32  # per channel, of 8 pixel values each
SATURATION_BINS = 16
DETAIL_BINS = 32
DETAIL_RANGE = (-3.0, 2.0)  # log2 of an image's fine detail (see `fine_detail`)
_CHANNEL_OFFSETS = np.arange(3, dtype=np.int32) * HISTOGRAM_BINS
LOOK_IMAGES = 512  # of a batch, at most about this many are measured for the look (every k-th)
# The luminance in integers: ITU-R BT.601's weights (0.299, 0.587, 0.114) in thousandths, so that a uint8 image's
# luminance is exact (0 to 255,000) and every statistic of it the same bits whatever the batch and the CPU.
LUMA_THOUSANDTHS = np.array([299, 587, 114], np.int32)
LUMA = (LUMA_THOUSANDTHS / 1000).astype(np.float32)  # the same weights, for a grey image made of a colour one
BASIS_SCALE = 1 << 14  # the DCT's basis in integers (of at most 4,096), see `luminance_descriptors`


def _dct_basis(size: int, count: int) -> np.ndarray:
    """The first `count` orthonormal DCT-II basis vectors of length `size`, [count, size]."""
    positions = np.arange(size)
    basis = np.cos(np.pi * (2 * positions[None, :] + 1) * np.arange(count)[:, None] / (2 * size))
    basis[:1] *= 1 / math.sqrt(2)
    return (basis * math.sqrt(2 / size)).astype(np.float32)


_BASIS = _dct_basis(FEATURE_SIDE, DCT_SIZE)
_INTEGER_BASIS = np.rint(_BASIS.astype(np.float64) * BASIS_SCALE)  # float64 holding integers
_FREQUENCIES = np.add.outer(np.arange(DCT_SIZE) ** 2, np.arange(DCT_SIZE) ** 2).ravel()[1:]
_WEIGHTS = _FREQUENCIES.astype(np.float64) ** 0.25


def luminance_thousandths(images: np.ndarray) -> np.ndarray:
    """int32 [n, H, W]: the luminance of uint8 [n, H, W, 3] images in thousandths of a pixel value, exact."""
    red, green, blue = (images[..., channel].astype(np.int32) for channel in range(3))
    return red * LUMA_THOUSANDTHS[0] + green * LUMA_THOUSANDTHS[1] + blue * LUMA_THOUSANDTHS[2]  # integers: exact


def descriptors(pixels: np.ndarray) -> np.ndarray:
    """float32 [n, 63] unit descriptors of uint8 (or integer-valued) [n, 32, 32, 3] pixels (a flat image's is all
    zeros)."""
    return luminance_descriptors(luminance_thousandths(np.asarray(pixels).astype(np.uint8)))


def luminance_descriptors(luminance: np.ndarray) -> np.ndarray:
    """float32 [n, 63] unit descriptors of int32 [n, 32, 32] luminance in thousandths: two matrix products (the DCT
    along the rows, then across) of integers in float64, every partial sum an integer below 2^53 (255,000 x 4,096 x
    32, then x 4,096 x 32: 4.4e15), so exact in any order of addition: the same bits whatever the batch's size and
    whatever kernels the CPU's BLAS picks."""
    count = len(luminance)
    rows = luminance.reshape(-1, FEATURE_SIDE).astype(np.float64)
    along_rows = (rows @ _INTEGER_BASIS.T).reshape(count, FEATURE_SIDE, DCT_SIZE)
    across = np.ascontiguousarray(along_rows.transpose(0, 2, 1)).reshape(-1, FEATURE_SIDE)  # [n * 8, 32 rows]
    exact = (across @ _INTEGER_BASIS.T).reshape(count, DCT_SIZE, DCT_SIZE).transpose(0, 2, 1)  # [n, down, across]
    coefficients = exact.reshape(count, -1)[:, 1:] * (_WEIGHTS / (1000.0 * BASIS_SCALE * BASIS_SCALE))  # no DC term
    norms = np.sqrt(np.einsum("ij,ij->i", coefficients, coefficients))[:, None]  # row by row, whatever the batch
    return np.where(norms > 1e-3, coefficients / np.maximum(norms, 1e-3), 0).astype(np.float32)


class Spool:
    """An unnamed scratch file that arrays are appended to and read back from: the descriptors wait on disk, not in
    memory, from their batch's statistics to the search (76 MB at 600,000 images, beside the encoding's peak)."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the arrays in it)
        self._end = 0
        self._lock = threading.Lock()

    def put(self, array: np.ndarray) -> SpooledArray:
        content = np.ascontiguousarray(array).tobytes()
        with self._lock:
            offset, self._end = self._end, self._end + len(content)
        os.pwrite(self._file.fileno(), content, offset)
        return SpooledArray(self, offset, array.shape, array.dtype)

    def read(self, offset: int, size: int) -> bytes:
        content = os.pread(self._file.fileno(), size, offset)
        if len(content) != size:
            raise OSError(f"scratch file of descriptors: {len(content)} of {size} bytes at {offset} read back")
        return content


@dataclass(frozen=True)
class SpooledArray:
    spool: Spool
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def array(self) -> np.ndarray:
        size = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        return np.frombuffer(self.spool.read(self.offset, size), self.dtype).reshape(self.shape)


_SPOOLS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # "current": this process's, while in use
os.register_at_fork(after_in_child=_SPOOLS.clear)  # a forked worker reads its parent's spool, and writes its own


def spooled(array: np.ndarray) -> SpooledArray:
    """`array` kept in this process's spool (one scratch file, gone when the last array in it is)."""
    spool = _SPOOLS.get("current")
    if spool is None:
        spool = _SPOOLS["current"] = Spool()
    return spool.put(array)


ONE_PRODUCT_CLASSES = 64  # up to this many classes, per-class sums are one matrix product


def _class_sums(flat: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """float64 [classes, values]: the sum of each class's rows of `flat` [n, values]; of uint8 pixels exact (integer
    sums), so that a split's sums are the same whichever parts they were added in."""
    if flat.dtype != np.uint8 and num_classes <= ONE_PRODUCT_CLASSES:
        one_hot = np.zeros((num_classes, len(labels)), flat.dtype)
        one_hot[labels, np.arange(len(labels))] = 1
        return (one_hot @ flat).astype(np.float64)
    sums = np.zeros((num_classes, flat.shape[1]))
    order = np.argsort(labels, kind="stable")
    present, starts = np.unique(labels[order], return_index=True)
    exact = np.int64 if flat.dtype == np.uint8 else None
    sums[present] = np.add.reduceat(flat[order], starts, axis=0, dtype=exact)
    return sums


_PIXEL_VALUES = np.arange(256, dtype=np.float64)


def _channel_sums(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 [3] each, exact: the sum of each channel's values over uint8 [n, H, W, 3] `images`, and of their
    squares (from each channel's count of every value)."""
    values = images.reshape(-1, 3)
    counts = np.stack([np.bincount(values[:, channel], minlength=256) for channel in range(3)]).astype(np.float64)
    return counts @ _PIXEL_VALUES, counts @ _PIXEL_VALUES**2


def at_feature_size(images: np.ndarray) -> np.ndarray:
    """uint8 [n, 32, 32, 3]: the images at the descriptors' size (area averages, rounded, when a multiple; else
    resized), every later sum of them exact."""
    height, width = images.shape[1:3]
    if (height, width) == (FEATURE_SIDE, FEATURE_SIDE):
        return images
    if height % FEATURE_SIDE == 0 and width % FEATURE_SIDE == 0:
        blocks = images.reshape(
            len(images), FEATURE_SIDE, height // FEATURE_SIDE, FEATURE_SIDE, width // FEATURE_SIDE, 3
        )
        area = (height // FEATURE_SIDE) * (width // FEATURE_SIDE)
        return ((blocks.sum(axis=(2, 4), dtype=np.int64) + area // 2) // area).astype(np.uint8)
    from components.prepare_data.sources import resized_in_batches

    return resized_in_batches(images, (FEATURE_SIDE, FEATURE_SIDE))


@dataclass
class SplitStatistics:
    """Running sums over one split's images, added a batch at a time; `summary()` gives the JSON form."""

    num_classes: int
    count: int = 0
    class_counts: np.ndarray = None
    channel_sum: np.ndarray = None  # float64 [3]
    channel_square_sum: np.ndarray = None
    class_pixel_sum: np.ndarray = None  # float64 [classes, 32*32*3]: sums of the images at 32x32, per class
    pixels_per_image: int = 0
    sizes: Counter = field(default_factory=Counter)  # "WxH" as the source had them
    aspects: Counter = field(default_factory=Counter)
    conversions: Counter = field(default_factory=Counter)  # colour kinds other than RGB
    ids: list[str] = field(default_factory=list)
    digests: list[np.ndarray] = field(default_factory=list)  # uint64 [n, 2] per batch
    features: list[SpooledArray] = field(default_factory=list)  # the descriptors, per batch, kept on disk
    channel_histogram: np.ndarray = None  # int64 [3, HISTOGRAM_BINS]
    saturation_histogram: np.ndarray = None  # int64 [SATURATION_BINS]
    detail_histogram: np.ndarray = None  # int64 [DETAIL_BINS]
    per_image_sums: np.ndarray = None  # float64 [2, PER_IMAGE]: sums and sums of squares of PER_IMAGE's measures
    look_count: int = 0  # the images the look was measured on
    class_per_image_sums: np.ndarray = None  # float64 [2, classes, PER_IMAGE]: the same, per class
    class_look_counts: np.ndarray = None  # int64 [classes]

    def __post_init__(self) -> None:
        self.channel_histogram = np.zeros((3, HISTOGRAM_BINS), np.int64)
        self.saturation_histogram = np.zeros(SATURATION_BINS, np.int64)
        self.detail_histogram = np.zeros(DETAIL_BINS, np.int64)
        self.per_image_sums = np.zeros((2, len(PER_IMAGE)))
        self.class_per_image_sums = np.zeros((2, self.num_classes, len(PER_IMAGE)))
        self.class_look_counts = np.zeros(self.num_classes, np.int64)
        self.class_counts = np.zeros(self.num_classes, np.int64)
        self.channel_sum = np.zeros(3)
        self.channel_square_sum = np.zeros(3)
        self.class_pixel_sum = np.zeros((self.num_classes, FEATURE_SIDE * FEATURE_SIDE * 3))

    def add(self, images: np.ndarray, labels: np.ndarray, ids: list[str], sizes, colors) -> None:
        """One batch: uint8 [n, H, W, 3] images as they will be written, their labels and ids, and the (height,
        width) [n, 2] and colour kind [n] each had in the source (colours None: all RGB). Pixels are converted to
        floats CHUNK_BYTES at a time, whatever the images' size."""
        chunk = max(1, CHUNK_BYTES // (4 * images[0].size)) if len(images) else 1
        for start in range(0, len(images), chunk):
            part = slice(start, start + chunk)
            self._add(images[part], labels[part], ids[part], sizes[part], colors, part)

    def _add(self, images: np.ndarray, labels: np.ndarray, ids: list[str], sizes, colors, part: slice) -> None:
        count = len(images)
        self.count += count
        self.class_counts += np.bincount(labels, minlength=self.num_classes)
        self.ids.extend(ids)
        self.digests.append(pixel_digests(images))
        self.pixels_per_image = images.shape[1] * images.shape[2]
        channel_sum, channel_square_sum = _channel_sums(images)
        self.channel_sum += channel_sum
        self.channel_square_sum += channel_square_sum
        small = at_feature_size(images)  # uint8 [n, 32, 32, 3]
        luminance = luminance_thousandths(small)  # int32 [n, 32, 32]
        self.features.append(spooled(luminance_descriptors(luminance).astype(DESCRIPTOR_DTYPE)))
        step = -(-count // LOOK_IMAGES)  # a systematic sample of a large batch: the look needs no more
        self._add_look(small[::step], luminance[::step], labels[::step])
        self.class_pixel_sum += _class_sums(small.reshape(count, -1), labels, self.num_classes)  # [classes, 3072]
        distinct, counts = np.unique(np.asarray(sizes).reshape(-1, 2), axis=0, return_counts=True)
        for (height, width), number in zip(distinct.tolist(), counts.tolist(), strict=True):
            self.sizes[f"{width}x{height}"] += number
            self.aspects[aspect_ratio(width, height)] += number
        if colors is not None:
            self.conversions.update(color for color in colors[part] if color != "RGB")

    def _add_look(self, small: np.ndarray, thousandths: np.ndarray, labels: np.ndarray) -> None:
        """The histograms and per-image measures of how the images look (of the split, and the measures of each
        class): luminance, contrast and detail from every pixel of the uint8 [n, 32, 32, 3] `small` (its luminance in
        `thousandths`, int32 [n, 32, 32]); the histograms
        and colour from every fourth pixel of every fourth row (64 an image: as good a histogram over thousands of
        images, at a sixteenth of the cost)."""
        sampled = small[:, ::4, ::4]  # uint8 [n, 8, 8, 3]
        codes = (sampled >> 3).astype(np.int32) + _CHANNEL_OFFSETS  # channel * 32 + value / 8
        self.channel_histogram += np.bincount(codes.ravel(), minlength=3 * HISTOGRAM_BINS).reshape(3, -1)
        red, green, blue = sampled[..., 0], sampled[..., 1], sampled[..., 2]
        chroma = np.maximum(np.maximum(red, green), blue) - np.minimum(np.minimum(red, green), blue)  # from grey
        self.saturation_histogram += np.bincount((chroma >> 4).ravel(), minlength=SATURATION_BINS)
        side, pooled = THUMBNAIL_SIDE, FEATURE_SIDE // THUMBNAIL_SIDE  # the luminance at 8x8: exact sums of 4x4
        sums = thousandths.reshape(len(small), side, pooled, side, pooled).sum(axis=(2, 4), dtype=np.int64)
        coarse = (sums.reshape(len(small), -1) / (1000.0 * pooled * pooled)).astype(np.float32)  # [n, 64]
        luminance = thousandths.astype(np.float32) / np.float32(1000)
        contrast = coarse.std(axis=1)  # what blur and noise leave alone, and contrast scales
        detail = fine_detail(luminance, contrast)
        low, high = DETAIL_RANGE
        bins = np.clip((np.log2(np.maximum(detail, 1e-6)) - low) * (DETAIL_BINS / (high - low)), 0, DETAIL_BINS - 1)
        self.detail_histogram += np.bincount(bins.astype(np.int64), minlength=DETAIL_BINS)
        measures = np.column_stack(
            [sampled.reshape(len(small), -1, 3).mean(axis=1, dtype=np.float32), coarse.mean(axis=1), contrast,
             chroma.reshape(len(small), -1).mean(axis=1, dtype=np.float32) / (contrast + 8.0), detail]
        ).astype(np.float64)  # fmt: skip
        self.per_image_sums += np.stack([measures.sum(axis=0), (measures**2).sum(axis=0)])
        self.look_count += len(small)
        for power in (0, 1):
            self.class_per_image_sums[power] += _class_sums(measures ** (power + 1), labels, self.num_classes)
        self.class_look_counts += np.bincount(labels, minlength=self.num_classes)

    # What `merge` adds up; the rest (the counters, ids, digests and descriptors) are joined in order.
    SUMS = ("count", "class_counts", "channel_sum", "channel_square_sum", "class_pixel_sum", "channel_histogram",
            "saturation_histogram", "detail_histogram", "per_image_sums", "look_count", "class_per_image_sums",
            "class_look_counts")  # fmt: skip
    COUNTERS = ("sizes", "aspects", "conversions")

    def merge(self, other: SplitStatistics) -> None:
        """Add `other`'s images (those that follow this one's): counts, sums and histograms added, the rest joined.
        A split's statistics are its shards' merged in shard order, by one process or by the merge of a fanned-out
        prepare alike: the same additions in the same order, so the same floats."""
        for name in self.SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in self.COUNTERS:
            getattr(self, name).update(getattr(other, name))
        self.pixels_per_image = other.pixels_per_image or self.pixels_per_image
        self.ids.extend(other.ids)
        self.digests.extend(other.digests)
        self.features.extend(other.features)

    def to_bytes(self) -> bytes:
        """An .npz of everything `merge` needs (what a worker of a fanned-out prepare hands to the merge)."""
        arrays = {name: np.asarray(getattr(self, name)) for name in self.SUMS}
        arrays["counters"] = np.array(json.dumps({name: list(getattr(self, name).items()) for name in self.COUNTERS}))
        arrays.update(num_classes=np.array(self.num_classes), pixels_per_image=np.array(self.pixels_per_image),
                      ids=np.array(self.ids, dtype=str), digests=_joined(self.digests, (0, 2), np.uint64),
                      features=self.descriptors())  # fmt: skip
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    def descriptors(self) -> np.ndarray:
        """The images' descriptors, [count, 63] at DESCRIPTOR_DTYPE, in the order they were added."""
        return _joined([batch.array() for batch in self.features], (0, _WEIGHTS.size), DESCRIPTOR_DTYPE)

    @classmethod
    def from_bytes(cls, content: bytes, origin: str) -> SplitStatistics:
        """`to_bytes`'s form read back; anything else is refused in one line naming `origin`."""
        try:
            with np.load(io.BytesIO(content), allow_pickle=False) as arrays:  # reader: bytes already read; checked
                statistics = cls(int(arrays["num_classes"]))
                for name in cls.SUMS:
                    value = arrays[name]
                    expected = np.shape(getattr(statistics, name))
                    if value.shape != expected:
                        raise ValueError(f"{name} has shape {value.shape}, expected {expected}")
                    setattr(statistics, name, value if value.ndim else value.item())
                for name, items in json.loads(str(arrays["counters"])).items():  # reader: within the checked npz
                    getattr(statistics, name).update({key: count for key, count in items})
                statistics.pixels_per_image = int(arrays["pixels_per_image"])
                statistics.ids = arrays["ids"].tolist()
                statistics.digests = [arrays["digests"]]
                statistics.features = [spooled(arrays["features"].astype(DESCRIPTOR_DTYPE, copy=False))]
        except (OSError, KeyError, ValueError, TypeError, AttributeError, zipfile.BadZipFile) as error:
            raise ValueError(f"{origin}: not a prepare worker's partial statistics ({error})") from error
        return statistics

    def summary(self) -> dict:
        pixels = max(1, self.count * self.pixels_per_image)
        mean = self.channel_sum / pixels
        variance = np.maximum(self.channel_square_sum / pixels - mean**2, 0)
        counts = np.maximum(self.class_counts, 1)[:, None]
        class_means = (self.class_pixel_sum / counts).reshape(self.num_classes, FEATURE_SIDE, FEATURE_SIDE, 3)
        side = FEATURE_SIDE // THUMBNAIL_SIDE
        thumbnails = class_means.reshape(self.num_classes, THUMBNAIL_SIDE, side, THUMBNAIL_SIDE, side, 3).mean(
            axis=(2, 4)
        )
        return {
            "count": self.count,
            "class_counts": self.class_counts.tolist(),
            "channel_mean": _rounded(mean),
            "channel_std": _rounded(np.sqrt(variance)),
            "class_channel_mean": [_rounded(row) for row in class_means.mean(axis=(1, 2))],
            "class_thumbnails": [_rounded(row, 1) for row in thumbnails.reshape(self.num_classes, -1)],
            "source_sizes": dict(self.sizes.most_common(50)),
            "source_aspect_ratios": dict(self.aspects.most_common(50)),
            "distinct_source_sizes": len(self.sizes),
            "converted_to_rgb": dict(sorted(self.conversions.items())),
            "channel_histogram": self.channel_histogram.tolist(),
            "saturation_histogram": self.saturation_histogram.tolist(),
            "detail_histogram": self.detail_histogram.tolist(),
            "per_image": per_image_summary(self.per_image_sums, self.look_count),
            "look_images": self.look_count,
            "class_per_image": class_per_image_summary(self.class_per_image_sums, self.class_look_counts),
            "class_look_images": self.class_look_counts.tolist(),
        }


def per_image_summary(sums: np.ndarray, count: int) -> dict:
    """{measure: {"mean", "std"}} over the images of each PER_IMAGE measure: a channel's mean value, brightness (mean
    luminance), contrast (the spread of the luminance at 8x8, which blur and noise leave alone), saturation (the mean
    distance of a pixel from grey, max - min of its channels, per unit of that contrast: grey images 0, and the same
    under any contrast), fine detail (`fine_detail`)."""
    count = max(count, 1)
    mean = sums[0] / count
    spread = np.sqrt(np.maximum(sums[1] / count - mean**2, 0))
    return {name: {"mean": round(float(m), 5), "std": round(float(s), 5)} for name, m, s in zip(PER_IMAGE, mean,
            spread, strict=True)}  # fmt: skip


def class_per_image_summary(sums: np.ndarray, counts: np.ndarray) -> dict:
    """{"mean": [classes][PER_IMAGE], "std": [classes][PER_IMAGE]}: `per_image_summary`'s measures of each class's
    images (a class without images: 0)."""
    count = np.maximum(counts, 1)[:, None]
    mean = sums[0] / count
    spread = np.sqrt(np.maximum(sums[1] / count - mean**2, 0))
    return {"mean": [_rounded(row, 5) for row in mean], "std": [_rounded(row, 5) for row in spread]}


def fine_detail(luminance: np.ndarray, contrast: np.ndarray) -> np.ndarray:
    """Per image [n] of float [n, H, W] luminance: the mean absolute Laplacian over the image's `contrast` (its
    luminance's spread at 8x8), how much detail it has at the finest scale for the contrast it has at a coarse one.
    Lower when an image is blurred, upscaled from a lower resolution or compressed hard; higher with noise;
    unchanged by brightness and contrast."""
    laplacian = 4 * luminance[:, 1:-1, 1:-1]
    laplacian -= luminance[:, :-2, 1:-1]
    laplacian -= luminance[:, 2:, 1:-1]
    laplacian -= luminance[:, 1:-1, :-2]
    laplacian -= luminance[:, 1:-1, 2:]
    np.abs(laplacian, out=laplacian)
    return laplacian.mean(axis=(1, 2)) / (contrast + 1.0)


def pixel_digests(images: np.ndarray) -> np.ndarray:
    """uint64 [n, 2]: two 64-bit multiply-add hashes of each image's bytes (fixed random odd multipliers): images
    with the same pixels have the same digests; others, with a chance of 2^-128 per pair."""
    count = len(images)
    flat = images.reshape(count, -1)
    padding = (-flat.shape[1]) % 8
    if padding:
        flat = np.concatenate([flat, np.zeros((count, padding), np.uint8)], axis=1)
    words = np.ascontiguousarray(flat).view(np.uint64)
    return words @ _digest_multipliers(words.shape[1]).T  # integer products and sums wrap modulo 2^64


def _digest_multipliers(count: int) -> np.ndarray:
    rng = np.random.default_rng(20201)
    return rng.integers(0, np.iinfo(np.uint64).max, size=(2, count), dtype=np.uint64, endpoint=True) | np.uint64(1)


def aspect_ratio(width: int, height: int) -> str:
    """'4:3', '1:1': the ratio in lowest terms, or to two decimals when those terms are large."""
    divisor = math.gcd(width, height) or 1
    across, down = width // divisor, height // divisor
    return f"{across}:{down}" if max(across, down) <= 32 else f"{width / height:.2f}:1"


def _rounded(values, digits: int = 4) -> list[float]:
    return [round(float(value), digits) for value in values]


def near_duplicate_pairs(features: np.ndarray, threshold: float = NEAR_DUPLICATE_THRESHOLD, seed: int = 0):
    """(i, j, similarity), i < j, of the descriptors whose cosine similarity is at least `threshold`.

    Up to EXHAUSTIVE_LIMIT images every pair is compared. Beyond, the descriptors are grouped into cells of about
    CELL_IMAGES images around centres (a few rounds of spherical k-means on a sample), and each image is compared with
    the images of its SEARCH_PROBES nearest cells: a near-duplicate pair lies so close (cosine 0.9 is an angle of 26
    degrees, where unrelated images are 80 to 90 apart) that its images almost always share a cell. An image's
    nearest cells are found among the cells of its GROUP_PROBES nearest groups of cells (the centres' own k-means), so
    that neither finding them nor comparing costs more an image as the images grow: the search's time is linear in
    their number, its memory that of the descriptors and a bounded block of scores. bench/scale.py measures its time
    and its recall against comparing every pair."""
    if len(features) <= EXHAUSTIVE_LIMIT:
        return _pairs_exhaustive(features, threshold)
    centres = _cell_centres(features, seed, max(1, round(len(features) / CELL_IMAGES)))
    probed = _nearest_cells(features, centres, SEARCH_PROBES, seed)
    by_probe = [_grouped(probed[:, probe], len(centres)) for probe in range(probed.shape[1])]  # [0]: the members
    del probed

    def pairs_of(cell: int):  # the cell's members against every image that probes it
        return _cell_pairs(features, threshold, by_probe[0][cell], np.concatenate([cells[cell] for cells in by_probe]))

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(SEARCH_THREADS) as pool:
        found = list(pool.map(pairs_of, range(len(centres))))
    return _distinct_pairs(*(list(parts) for parts in zip(*found, strict=True)), len(features))


def _cell_pairs(features: np.ndarray, threshold: float, members: np.ndarray, probers: np.ndarray):
    """(left, right, similarity) of the pairs of a cell's `members` and the images that probe it (`probers`), at
    least `threshold`, each pair's smaller index left; scored SCORE_ELEMENTS at a time."""
    found_left, found_right, found_similarity = (
        [np.zeros(0, np.int32)],
        [np.zeros(0, np.int32)],
        [np.zeros(0, np.float32)],
    )
    if len(members) and len(probers):
        cell_features = _rows(features, members).T
        block = max(1, SCORE_ELEMENTS // len(members))
        for start in range(0, len(probers), block):
            rows_of = probers[start : start + block]
            similarity = _rows(features, rows_of) @ cell_features
            candidates = np.flatnonzero(similarity.max(axis=1) >= threshold)  # few rows: look only at those
            hit_rows, columns = np.nonzero(similarity[candidates] >= threshold)
            rows = candidates[hit_rows]
            left, right = rows_of[rows], members[columns]
            keep = left != right
            found_left.append(np.minimum(left, right)[keep])
            found_right.append(np.maximum(left, right)[keep])
            found_similarity.append(similarity[rows, columns][keep])
    return np.concatenate(found_left), np.concatenate(found_right), np.concatenate(found_similarity)


def _rows(features: np.ndarray, chosen) -> np.ndarray:
    """float32 rows of the descriptors (held at DESCRIPTOR_DTYPE), for the products."""
    return np.asarray(features[chosen], np.float32)


def _nearest_cells(features: np.ndarray, centres: np.ndarray, probes: int, seed: int) -> np.ndarray:
    """int32 [n, probes]: each descriptor's nearest cells, nearest first. Up to FLAT_CELLS cells, from its scores
    with every centre; beyond, from its scores with the centres of its GROUP_PROBES nearest groups of cells (about
    the square root of the cells, grouped by k-means of the centres), NEAREST_ROWS descriptors at a time on
    SEARCH_THREADS threads."""
    probes = min(probes, len(centres))
    if len(centres) <= FLAT_CELLS:
        return _nearest_flat(features, centres, probes)
    groups = _cell_centres(centres, seed, math.ceil(math.sqrt(len(centres))))
    cells_by_group = _grouped((centres @ groups.T).argmax(axis=1), len(groups))
    group_probes = min(GROUP_PROBES, len(groups))
    probed = np.empty((len(features), probes), np.int32)

    def nearest(start: int) -> None:
        part = _rows(features, slice(start, start + NEAREST_ROWS))
        nearest_groups = _nearest_flat(part, groups, group_probes)
        scores = np.full((len(part), group_probes * probes), -np.inf, np.float32)
        named = np.zeros((len(part), group_probes * probes), np.int32)
        for slot in range(group_probes):  # each row's slot-th nearest group: its best cells in columns of their own
            for positions, cells in zip(_grouped(nearest_groups[:, slot], len(groups)), cells_by_group, strict=True):
                if not len(positions) or not len(cells):
                    continue
                kept = min(probes, len(cells))
                cell_scores = part[positions] @ centres[cells].T
                best = np.argpartition(-cell_scores, kept - 1, axis=1)[:, :kept]
                columns = slice(slot * probes, slot * probes + kept)
                scores[positions, columns] = np.take_along_axis(cell_scores, best, axis=1)
                named[positions, columns] = cells[best]
        order = np.argsort(-scores, axis=1, kind="stable")[:, :probes]
        probed[start : start + len(part)] = np.take_along_axis(named, order, axis=1)

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(SEARCH_THREADS) as pool:
        list(pool.map(nearest, range(0, len(features), NEAREST_ROWS)))
    return probed


def _nearest_flat(features: np.ndarray, centres: np.ndarray, probes: int) -> np.ndarray:
    """int32 [n, probes]: each descriptor's nearest centres, nearest first, scored SCORE_ELEMENTS at a time."""
    probed = np.empty((len(features), probes), np.int32)
    block = max(1, SCORE_ELEMENTS // len(centres))
    for start in range(0, len(features), block):
        scores = _rows(features, slice(start, start + block)) @ centres.T
        rows = np.arange(len(scores))
        for probe in range(probes):  # argmax beats a partial sort here
            probed[start : start + block, probe] = scores.argmax(axis=1)
            scores[rows, probed[start : start + block, probe]] = -np.inf
    return probed


def _pairs_exhaustive(features: np.ndarray, threshold: float):
    found_left, found_right, found_similarity = [], [], []
    features = _rows(features, slice(None))
    for start in range(0, len(features), SEARCH_BLOCK):
        similarity = features[start : start + SEARCH_BLOCK] @ features[start:].T
        rows, columns = np.nonzero(similarity >= threshold)
        keep = columns > rows
        rows, columns = rows[keep], columns[keep]
        found_left.append(rows + start)
        found_right.append(columns + start)
        found_similarity.append(similarity[rows, columns])
    return _distinct_pairs(found_left, found_right, found_similarity, len(features))


def _distinct_pairs(lefts: list, rights: list, similarities: list, count: int):
    if not lefts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    keys = np.concatenate(lefts).astype(np.int64) * count + np.concatenate(rights)
    keys, first = np.unique(keys, return_index=True)
    return keys // count, keys % count, np.concatenate(similarities)[first]


def _cell_centres(features: np.ndarray, seed: int, cells: int) -> np.ndarray:
    """`cells` unit centres: spherical k-means, five rounds, on a sample of SAMPLE_PER_CELL images a cell (at least
    SAMPLE_FLOOR), its assignments summed SCORE_ELEMENTS at a time."""
    rng = np.random.default_rng(seed)
    size = min(len(features), max(SAMPLE_FLOOR, SAMPLE_PER_CELL * cells))
    sample = _rows(features, rng.choice(len(features), size, replace=False))
    centres = sample[rng.choice(len(sample), cells, replace=False)].copy()
    block = max(1, SCORE_ELEMENTS // cells)
    for _ in range(5):
        sums = np.zeros_like(centres)
        for start in range(0, len(sample), block):
            part = sample[start : start + block]
            nearest = (part @ centres.T).argmax(axis=1)
            members = np.zeros((len(part), cells), np.float32)
            members[np.arange(len(part)), nearest] = 1
            sums += members.T @ part
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        centres = np.where(norms > 0, sums / np.maximum(norms, 1e-9), centres)
    return centres


def _grouped(cells: np.ndarray, count: int) -> list[np.ndarray]:
    """int32 positions grouped by their cell, for cells 0..count-1."""
    order = np.argsort(cells, kind="stable")
    bounds = np.searchsorted(cells[order], np.arange(count + 1))
    positions = order.astype(np.int32)
    return [positions[bounds[cell] : bounds[cell + 1]] for cell in range(count)]


@dataclass(frozen=True)
class Comparison:
    """The duplicates of one split within itself, or of one split in another."""

    split: str
    other: str  # == split: within it
    left: np.ndarray  # indices in `split`
    right: np.ndarray  # indices in `other`
    similarity: np.ndarray
    exact: np.ndarray  # bool: the same pixels

    @property
    def images_with_duplicate(self) -> np.ndarray:
        """Indices (in `split`) of the images that have a near-duplicate (within: either of a pair)."""
        found = self.left if self.split != self.other else np.concatenate([self.left, self.right])
        return np.unique(found)

    def summary(self, ids: dict[str, list[str]]) -> dict:
        order = np.lexsort((-self.similarity, ~self.exact))[:LISTED_PAIRS]  # exact first, then most similar
        return {
            "split": self.split,
            "other": self.other,
            "near_duplicate_pairs": len(self.left),
            "exact_duplicate_pairs": int(self.exact.sum()),
            "images_with_near_duplicate": len(self.images_with_duplicate),
            "pairs": [
                {
                    "id": ids[self.split][self.left[index]],
                    "other_id": ids[self.other][self.right[index]],
                    "similarity": round(float(self.similarity[index]), 4),
                    "exact": bool(self.exact[index]),
                }
                for index in order
            ],
        }


def comparisons(statistics: dict[str, SplitStatistics]) -> list[Comparison]:
    """Every split within itself and against each other (train last), from one search over all images."""
    names = list(statistics)
    counts = [statistics[name].count for name in names]
    offsets = np.cumsum([0, *counts])
    features = _joined_features(statistics, names)
    left, right, similarity = near_duplicate_pairs(features)
    digests = np.concatenate(
        [batch for name in names for batch in statistics[name].digests] or [np.zeros((0, 2), np.uint64)]
    )
    exact_pairs = _exact_pairs(digests)
    if exact_pairs.size:  # the same pixels are near-duplicates too (a flat image's descriptor is zero: add them)
        known = set((left * len(features) + right).tolist())
        missing = exact_pairs[
            [key not in known for key in (exact_pairs[:, 0] * len(features) + exact_pairs[:, 1]).tolist()]
        ]
        left = np.concatenate([left, missing[:, 0]])
        right = np.concatenate([right, missing[:, 1]])
        similarity = np.concatenate([similarity, np.ones(len(missing), np.float32)])
    exact_keys = set((exact_pairs[:, 0] * len(features) + exact_pairs[:, 1]).tolist()) if exact_pairs.size else set()
    exact = np.array([key in exact_keys for key in (left * len(features) + right).tolist()], bool)
    split_of = np.searchsorted(offsets, np.arange(len(features)), side="right") - 1
    ordered = sorted(range(len(names)), key=lambda index: names[index] == "train")  # train is the "other" side
    found = []
    for position, first in enumerate(ordered):
        for second in ordered[position:]:
            if names[first] != names[second] and names[first] == "train":
                continue
            chosen = _between(split_of, left, right, first, second)
            one, two = left[chosen], right[chosen]
            swap = split_of[one] != first  # pairs are stored (smaller index, larger): put `first`'s image left
            one, two = np.where(swap, two, one), np.where(swap, one, two)
            found.append(
                Comparison(
                    names[first],
                    names[second],
                    one - offsets[first],
                    two - offsets[second],
                    similarity[chosen],
                    exact[chosen],
                )
            )
    return found


def _joined_features(statistics: dict[str, SplitStatistics], names: list[str]) -> np.ndarray:
    """The descriptors of every split, in `names`' order, in one array; each split's batches are let go as they are
    copied (this is their one use), so that the descriptors are held once, not two or three times, at the peak."""
    features = np.empty((sum(statistics[name].count for name in names), _WEIGHTS.size), DESCRIPTOR_DTYPE)
    position = 0
    for name in names:
        batches, statistics[name].features = statistics[name].features, []
        while batches:
            batch = batches.pop(0).array()
            features[position : position + len(batch)] = batch
            position += len(batch)
            if len(batches) % RELEASE_BATCHES == 0:
                release_freed_memory()
    return features


def release_freed_memory() -> None:
    """Hand the C allocator's freed pages back to the system. Each batch of descriptors read back from the spool (a
    shard's, 315 KB at half precision) is allocated from the allocator's heaps, which keep what is freed for reuse:
    copied into the joined array and freed, the batches would stay resident beside it (38 MB at 600,000 images).
    glibc only; elsewhere nothing is done."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _joined(batches: list[np.ndarray], empty_shape: tuple[int, int], dtype) -> np.ndarray:
    return np.concatenate(batches) if batches else np.zeros(empty_shape, dtype)


def _between(split_of: np.ndarray, left: np.ndarray, right: np.ndarray, first: int, second: int) -> np.ndarray:
    a, b = split_of[left], split_of[right]
    return ((a == first) & (b == second)) | ((a == second) & (b == first))


def _exact_pairs(digests: np.ndarray) -> np.ndarray:
    """[k, 2] (i, j), i < j, of images with the same pixels (the same digests)."""
    order = np.lexsort((digests[:, 1], digests[:, 0]))
    ordered = digests[order]
    starts = np.flatnonzero(np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]) if len(order) else order
    sizes = np.diff(np.r_[starts, len(order)])
    pairs = [
        pair
        for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True)
        for pair in itertools.combinations(sorted(order[start : start + size].tolist()), 2)
    ]
    return np.array(pairs, np.int64).reshape(-1, 2)


def dataset_statistics(
    label_names: list[str], statistics: dict[str, SplitStatistics]
) -> tuple[dict, dict[str, Comparison]]:
    """The statistics document, and per split other than train its comparison with the training split."""
    ids = {name: split.ids for name, split in statistics.items()}
    found = comparisons(statistics)
    leaks = {
        comparison.split: comparison
        for comparison in found
        if comparison.other == "train" and comparison.split != "train"
    }
    leaking = {name: comparison.images_with_duplicate for name, comparison in leaks.items()}
    document = {
        "schema_version": STATISTICS_VERSION,
        "label_names": list(label_names),
        "method": {
            "descriptor": f"{DCT_SIZE}x{DCT_SIZE} lowest DCT frequencies of the 32x32 luminance, 1/f-flattened",
            "near_duplicate_threshold": NEAR_DUPLICATE_THRESHOLD,
            "exact": "the same pixels",
        },
        "splits": {name: split.summary() for name, split in statistics.items()},
        "duplicates": [comparison.summary(ids) for comparison in found],
        "leakage": {name: len(indices) for name, indices in leaking.items()},
        "leaking_ids": {
            name: [ids[name][index] for index in indices[:LISTED_LEAKING]] for name, indices in leaking.items()
        },
    }
    return document, leaks


def describe(named_splits: dict, label_names: list[str], batch: int) -> dict[str, SplitStatistics]:
    """Statistics of the splits (RawSplit), gathering their pixels `batch` images at a time (a pass of its own)."""
    progress = Progress("statistics", sum(len(split) for split in named_splits.values()), unit="images", logger=logger)
    statistics = {}
    for name, split in named_splits.items():
        statistics[name] = SplitStatistics(len(label_names))
        for start in range(0, len(split), batch):
            part = slice(start, start + batch)
            images, sizes, colors = split.examples(part)
            statistics[name].add(images, split.labels[part], split.ids[part], sizes, colors)
            progress.advance(len(split.labels[part]))
    return statistics


def document(label_names: list[str], statistics: dict[str, SplitStatistics]) -> dict:
    """statistics.json's content; says so in the log when a split leaks."""
    described, _leaks = dataset_statistics(label_names, statistics)
    for name, count in described["leakage"].items():
        if count:
            logger.warning(
                "leakage: %d of the %d %s images have a near-duplicate in the training split (e.g. %s and %s)",
                count,
                statistics[name].count,
                name,
                *_first_pair(described, name),
            )
    return described


def _first_pair(described: dict, split: str) -> tuple[str, str]:
    for comparison in described["duplicates"]:
        if comparison["split"] == split and comparison["other"] == "train" and comparison["pairs"]:
            return comparison["pairs"][0]["id"], comparison["pairs"][0]["other_id"]
    return "?", "?"


def remove_leaks(named_splits: dict, label_names: list[str], config) -> tuple[dict, dict]:
    """The splits with leaking images removed as `config.leakage` says, and what was removed: "drop_from_train"
    removes from the training split every image that is a near-duplicate of a validation or test image;
    "drop_from_eval" removes from the validation and test splits every image that has one in training."""
    statistics = describe(named_splits, label_names, config.examples_per_shard)
    _document, leaks = dataset_statistics(label_names, statistics)
    if config.leakage == "drop_from_train":
        found = [leak.right for leak in leaks.values()]
        removing = {"train": np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)}
    else:
        removing = {name: leak.images_with_duplicate for name, leak in leaks.items()}
    kept = dict(named_splits)
    for name, indices in removing.items():
        mask = np.ones(len(kept[name]), bool)
        mask[indices] = False
        kept[name] = kept[name].take(np.flatnonzero(mask))
        logger.info("leakage=%s: removed %d images from the %s split", config.leakage, len(indices), name)
    removed = {
        "mode": config.leakage,
        "leakage_before": {name: len(leak.images_with_duplicate) for name, leak in leaks.items()},
        "images_removed": {name: len(indices) for name, indices in removing.items()},
    }
    return kept, removed


def to_json(document: dict) -> bytes:
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()
