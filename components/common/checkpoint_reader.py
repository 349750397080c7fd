"""Opening a checkpoint to read its values, whole or not at all: every stage that reads one (a warm start, an
evaluation) goes through `open_whole`, so a checkpoint whose data file was cut short or damaged is refused in one
line naming it, wherever the damage lies (TensorFlow reads a tensor only when asked, so damage past the tensors a
reader happens to use would otherwise pass)."""

from __future__ import annotations

import tensorflow as tf


class UnreadableCheckpointError(ValueError):
    """A checkpoint that cannot be read whole; the message names it and the first value that failed."""


def open_whole(path: str):
    """A reader of the checkpoint at `path` (a prefix such as `.../ckpt-40`), every value read once to prove it."""
    try:
        reader = tf.train.load_checkpoint(path)
        for key in sorted(reader.get_variable_to_shape_map()):
            reader.get_tensor(key)
    except Exception as error:  # damage surfaces as OpError, DataLossError, IndexError, ValueError...
        text = (getattr(error, "message", None) or str(error) or type(error).__name__).splitlines()[0][:200]
        raise UnreadableCheckpointError(f"{path}: a damaged checkpoint ({type(error).__name__}: {text})") from error
    return reader
