"""A source's pixels on disk, not in memory: uint8 images of one shape appended to an unnamed scratch file (gone
when closed or when the process ends) and gathered back by position, a shard's worth at a time. So prepare_data's
memory holds a batch of the source and a shard, whatever the dataset's size; the page cache keeps what fits."""

from __future__ import annotations

import os
import tempfile

import numpy as np


class PixelFile:
    """Images of `image_shape` (height, width, channels), in the order appended; `gather` reads any of them."""

    dtype = np.dtype(np.uint8)

    def __init__(self, image_shape: tuple[int, ...]):
        self.image_shape = tuple(int(side) for side in image_shape)
        self.image_bytes = int(np.prod(self.image_shape))
        self.count = 0
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the split that reads it)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.count, *self.image_shape)

    def __len__(self) -> int:
        return self.count

    def append(self, images: np.ndarray) -> None:
        """uint8 [n, *image_shape], written after the images already held."""
        if images.shape[1:] != self.image_shape or images.dtype != self.dtype:
            raise ValueError(f"images {images.dtype} {images.shape[1:]} appended to {self.dtype} {self.image_shape}")
        self._file.write(np.ascontiguousarray(images).data)
        self.count += len(images)

    def gather(self, wanted: np.ndarray) -> np.ndarray:
        """The images at positions `wanted`, in that order, as one contiguous array: read in position order, one
        read for each run of neighbours."""
        self._file.flush()
        wanted = np.asarray(wanted, np.int64)
        if len(wanted) and (wanted.min() < 0 or wanted.max() >= self.count):
            raise IndexError(f"positions {wanted.min()}..{wanted.max()} of {self.count} images")
        if not len(wanted):
            return np.empty((0, *self.image_shape), np.uint8)
        order = np.argsort(wanted, kind="stable")
        ordered = wanted[order]
        in_order = np.empty((len(wanted), *self.image_shape), np.uint8)
        flat = in_order.reshape(-1)
        breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
        for start, end in zip(np.r_[0, breaks], np.r_[breaks, len(ordered)], strict=True):
            self._read_into(flat[start * self.image_bytes : end * self.image_bytes], int(ordered[start]))
        if np.array_equal(order, np.arange(len(order))):
            return in_order
        gathered = np.empty_like(in_order)
        gathered[order] = in_order
        return gathered

    def _read_into(self, target: np.ndarray, position: int) -> None:
        view, offset = memoryview(target), position * self.image_bytes
        while len(view):
            read = os.preadv(self._file.fileno(), [view], offset)
            if read <= 0:
                raise OSError(f"the scratch file of {self.count} images ended at byte {offset}")
            view, offset = view[read:], offset + read
