"""Resizing images, the one way the project does it: for images prepared with a target size and for encoded images
a served model receives, so that both see the same pixels."""

from __future__ import annotations


def resize_images(images, height: int, width: int):
    """uint8 `[N, H, W, C]` -> uint8 `[N, height, width, C]`: bilinear with antialiasing (an area average when
    shrinking), rounded. Images already of that size come back unchanged (the kernel is then exactly one pixel)."""
    import tensorflow as tf

    scaled = tf.image.resize(tf.cast(images, tf.float32), [height, width], method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(scaled), 0.0, 255.0), tf.uint8)
