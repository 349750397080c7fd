"""The validation split during training: its loss and accuracy at a few dozen steps, beside the training curves in
TensorBoard (as Keras's `validation_data` gives), so that the split held out of training has a use.

Measured by the chief alone on the raw weights (the moving average, when there is one, is what the evaluate stage
measures), in batches, without test-time augmentation.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from components.common.model import predict_logits

logger = logging.getLogger(__name__)

BATCH = 500


class Validation:
    def __init__(self, dataset, model):
        images, labels = [], []
        for batch_images, batch_labels in dataset.tf_dataset("validation", batch_size=4096):
            images.append(batch_images.numpy())
            labels.append(batch_labels.numpy())
        self.images, self.labels = np.concatenate(images), np.concatenate(labels)
        self.logits = tf.function(lambda batch: predict_logits(model, batch, "none"))

    def __len__(self) -> int:
        return len(self.labels)

    def measure(self) -> dict[str, float]:
        losses, correct = [], 0
        for start in range(0, len(self.labels), BATCH):
            logits = self.logits(tf.constant(self.images[start : start + BATCH]))
            labels = self.labels[start : start + BATCH]
            losses.append(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).numpy())
            correct += int(np.sum(np.argmax(logits.numpy(), axis=-1) == labels))
        return {"loss": float(np.mean(np.concatenate(losses))), "accuracy": correct / len(self.labels)}
