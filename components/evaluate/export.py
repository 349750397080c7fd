"""The SavedModel a promotion exports, in the form TF Serving and KServe load.

Two serving signatures, the same model, the same test-time augmentation, the same class names:
- `serving_default`: uint8 images `[N, H, W, C]` (input `images`);
- `serving_image_bytes`: encoded JPEG or PNG images of any size (input `image_bytes`, strings), decoded and, when the
  model's data was resized to its input size, resized the same way (else another size is refused, as the data's
  images were). Its input name ends in `_bytes`, so TF Serving's REST API (and KServe's v1 protocol, which passes
  it through) decodes `{"b64": ...}` values: `{"signature_name": "serving_image_bytes", "instances":
  [{"image_bytes": {"b64": "..."}}]}`.
Both return `probabilities`, `classes` (the top class's index) and `class_names`.

Beside the SavedModel, `checkpoint/` holds the evaluated checkpoint, which the next (scheduled) run warm-starts from:
it outlives the run's model directory, which artifact retention may expire.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tensorflow as tf

from components.common import filesystem
from components.common.model import check_label_count, predict_logits
from components.common.pixels import resize_images

SIGNATURES = ("serving_default", "serving_image_bytes")
LABEL_NAMES_ASSET = "label_names.json"
CHECKPOINT_FOLDER = "checkpoint"


class ServingModule(tf.Module):
    def __init__(self, model, label_names: list[str], test_time_augmentation: str = "none", resize: bool = False):
        super().__init__()
        self.model = model
        self.test_time_augmentation = test_time_augmentation
        self.resize = resize
        check_label_count(int(model.output_shape[-1]), label_names, model.name, "the class names to export")
        self.label_names = tf.constant(label_names)
        self.height, self.width, self.channels = model.input_shape[1:]
        self.serve = tf.function(
            self._serve,
            input_signature=[tf.TensorSpec([None, self.height, self.width, self.channels], tf.uint8, name="images")],
        )
        self.serve_image_bytes = tf.function(
            self._serve_image_bytes, input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")]
        )

    def _serve(self, images):
        logits = predict_logits(self.model, images, self.test_time_augmentation)
        probabilities = tf.nn.softmax(logits, axis=-1)
        top = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "classes": top, "class_names": tf.gather(self.label_names, top)}

    def _decode(self, content):
        image = tf.io.decode_image(content, channels=self.channels, expand_animations=False)
        if self.resize:
            return resize_images(image[None], self.height, self.width)[0]
        height, width = tf.shape(image)[0], tf.shape(image)[1]
        same_size = tf.logical_and(tf.equal(height, self.height), tf.equal(width, self.width))
        shape = [self.height, self.width, self.channels]

        def refuse():
            message = f"the image is not {self.width}x{self.height}, the size this model's data had"
            with tf.control_dependencies([tf.debugging.Assert(False, [message, width, height])]):
                return tf.zeros(shape, tf.uint8)

        return tf.cond(same_size, lambda: tf.reshape(image, shape), refuse)

    def _serve_image_bytes(self, image_bytes):
        spec = tf.TensorSpec([self.height, self.width, self.channels], tf.uint8)
        images = tf.map_fn(self._decode, image_bytes, fn_output_signature=spec)
        return self._serve(images)


def export_saved_model(
    model,
    label_names: list[str],
    directory: str | Path,
    test_time_augmentation: str = "none",
    resize: bool = False,
    checkpoint_files: list[Path] = (),
) -> None:
    """The serving signatures include the test-time augmentation, so the server answers as evaluation measured;
    `checkpoint_files` (the evaluated checkpoint) go into `checkpoint/` beside the SavedModel, the class names into
    `assets/label_names.json`."""
    module = ServingModule(model, label_names, test_time_augmentation, resize)
    tf.saved_model.save(
        module,
        str(directory),
        signatures={"serving_default": module.serve, "serving_image_bytes": module.serve_image_bytes},
    )
    # The class names, for a reader of the SavedModel alone (batch prediction's top-k names); TF Serving ignores it.
    assets = Path(directory, "assets")
    assets.mkdir(exist_ok=True)
    filesystem.atomic_write_bytes(
        assets / LABEL_NAMES_ASSET, (json.dumps({"label_names": list(label_names)}) + "\n").encode()
    )
    for path in checkpoint_files:
        target = Path(directory, CHECKPOINT_FOLDER, Path(path).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)  # writer: the model's own checkpoint files into its export folder
