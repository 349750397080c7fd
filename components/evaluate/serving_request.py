"""The request a client sends the served model (KServe's v1 protocol, TensorFlow Serving's REST API) and the answer
it gets back, computed here from the SavedModel without a server: to try a promoted model before deploying it, and
to show in the docs what a server answers.

    python -m components.evaluate.serving_request IMAGE.png [IMAGE.jpg ...] > request.json
    python -m components.evaluate.serving_request --answer-from PROMOTION_ROOT IMAGE.png      (request and answer)

The request names the encoded-image signature and sends each image base64-encoded under the input `image_bytes`:
`{"signature_name": "serving_image_bytes", "instances": [{"image_bytes": {"b64": "..."}}]}`. TF Serving answers in
its row format, one object per instance: `{"predictions": [{"classes": 3, "class_names": "cat",
"probabilities": [...]}]}`.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

from components.common import filesystem
from components.common.tensorflow_messages import what_tensorflow_said

SIGNATURE = "serving_image_bytes"
INPUT = "image_bytes"


def request_body(images: list[bytes]) -> dict:
    return {
        "signature_name": SIGNATURE,
        "instances": [{INPUT: {"b64": base64.b64encode(image).decode()}} for image in images],
    }


def served_version(root: str | Path) -> Path:
    """What TensorFlow Serving loads from a model base path: its numerically highest folder with a SavedModel."""
    root = Path(root)
    if (root / "saved_model.pb").exists():
        return root
    versions = [path for path in root.iterdir() if path.name.isdigit() and (path / "saved_model.pb").exists()]
    if not versions:
        raise ValueError(f"{root}: no numbered version folder with a saved_model.pb (nothing promoted yet?)")
    return max(versions, key=lambda path: int(path.name))


class RequestError(ValueError):
    """An image, a model folder or an answer that cannot be had; the message names which."""


def answer(saved_model: str | Path, body: dict, names: list[str] | None = None) -> dict:
    """The REST answer to `body` from the SavedModel at `saved_model` (a version folder or a promotion root);
    RequestError naming the image (from `names`) the model cannot take."""
    import tensorflow as tf

    folder = served_version(saved_model)
    try:
        loaded = tf.saved_model.load(str(folder))
        signature = loaded.signatures[body.get("signature_name", SIGNATURE)]
    except (OSError, KeyError, ValueError, tf.errors.OpError) as error:
        raise RequestError(f"{folder}: not a servable model with the {SIGNATURE} signature ({error})") from error
    encoded = [base64.b64decode(instance[INPUT]["b64"]) for instance in body["instances"]]
    try:
        outputs = signature(**{INPUT: tf.constant(encoded)})
    except tf.errors.InvalidArgumentError:
        for index, image in enumerate(encoded):  # which one: each alone
            try:
                signature(**{INPUT: tf.constant([image])})
            except tf.errors.InvalidArgumentError as error:
                name = names[index] if names else f"instance {index}"
                size, wanted = _size_of(image), _input_size(loaded)
                if size is not None and wanted is not None and size != wanted:
                    raise RequestError(
                        f"{name}: the image is {size[1]}x{size[0]}, the served model takes {wanted[1]}x{wanted[0]} "
                        f"images (width x height): resize it to {wanted[1]}x{wanted[0]} first"
                    ) from error
                reason = what_tensorflow_said(error.message or str(error), type(error).__name__)[:300]
                raise RequestError(f"{name}: the served model cannot take this image ({reason})") from error
        raise
    rows = []
    for index in range(len(encoded)):
        row = {}
        for name, value in sorted(outputs.items()):
            item = value.numpy()[index]
            row[name] = item.decode() if isinstance(item, bytes) else item.tolist()
        rows.append(row)
    return {"predictions": rows}


def _size_of(image: bytes) -> tuple[int, int] | None:
    """(height, width) of an encoded image, or None when it does not decode."""
    import tensorflow as tf

    try:
        shape = tf.io.decode_image(image, channels=3, expand_animations=False).shape
    except (tf.errors.OpError, ValueError):
        return None
    return int(shape[0]), int(shape[1])


def _input_size(loaded) -> tuple[int, int] | None:
    """(height, width) the model's uint8 signature takes, or None when it does not say."""
    signature = loaded.signatures.get("serving_default")
    spec = signature.structured_input_signature[1].get("images") if signature is not None else None
    if spec is None or spec.shape.rank != 4 or None in spec.shape[1:3]:
        return None
    return int(spec.shape[1]), int(spec.shape[2])


def read_images(paths: list[Path]) -> list[bytes]:
    """Each file's bytes; RequestError naming a file that is missing, not a file, or not a JPEG, PNG, GIF or BMP."""

    images = []
    for path in paths:
        try:
            content = filesystem.read_regular_file(path, MAX_IMAGE_BYTES)
        except FileNotFoundError as error:
            raise RequestError(f"{path}: no such file") from error
        except IsADirectoryError as error:
            raise RequestError(f"{path}: a folder, not an image") from error
        except filesystem.FileReadError as error:  # it names the file: a FIFO, a device, too large
            raise RequestError(str(error)) from error
        except OSError as error:
            raise RequestError(f"{path}: cannot be read ({error.strerror or error})") from error
        if not content.startswith(IMAGE_MAGIC):
            raise RequestError(f"{path}: not a JPEG, PNG, GIF or BMP image (what the served model decodes)")
        images.append(content)
    return images


MAX_IMAGE_BYTES = 64 << 20
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")


def main(argv: list[str] | None = None) -> int:
    import logging

    from components.common import exit_codes
    from components.common.config import ArgumentParser
    from components.common.logs import setup_logging

    parser = ArgumentParser(prog="python -m components.evaluate.serving_request", description=__doc__.split("\n")[0])
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    parser.add_argument("--answer-from", help="a promotion root or version folder: also print its answer")
    arguments = parser.parse_args(argv)
    setup_logging("WARNING")
    try:
        body = request_body(read_images(arguments.images))
        if arguments.answer_from is None:
            json.dump(body, sys.stdout)
        else:
            names = [str(path) for path in arguments.images]
            json.dump({"request": body, "answer": answer(arguments.answer_from, body, names)}, sys.stdout, indent=1)
    except (RequestError, ValueError, OSError) as error:
        logging.getLogger(parser.prog).error("%s", error)
        return exit_codes.BAD_INPUT
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
